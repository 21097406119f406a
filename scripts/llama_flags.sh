# Sourced by scripts/install.sh and scripts/llama_server.sh before they build llama.cpp: compiler flags for its CPU
# code. ggml builds for this CPU (-march=native), which on CPUs with AMX units turns on its AMX kernels, and
# those crash (a segfault at the first model load). ggml's GGML_AMX_* options do not undo what -march=native
# turns on; the compiler's -mno-amx-* flags do, whatever their order. Sourcing it twice adds them once.
if [ "$(uname -m)" = x86_64 ]; then
  LLAMA_NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  case " ${CFLAGS:-} " in *" $LLAMA_NO_AMX "*) ;; *) export CFLAGS="${CFLAGS:+$CFLAGS }$LLAMA_NO_AMX" ;; esac
  case " ${CXXFLAGS:-} " in *" $LLAMA_NO_AMX "*) ;; *) export CXXFLAGS="${CXXFLAGS:+$CXXFLAGS }$LLAMA_NO_AMX" ;; esac
fi
