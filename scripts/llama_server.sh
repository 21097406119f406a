#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` (the C++ OpenAI-compatible server: N slots decoded in one batch) from the
# llama.cpp sources vendored in the llama-cpp-python sdist we pin, into the cache, once. Nothing on PyPI or in
# Debian 12 ships a CPU build of it, and no other host is reachable. A binary already there is kept: rerunning
# costs nothing. `mhqa_graph.models.server` finds it there ($MHQA_LLAMA_SERVER overrides).
# Needs the project's .venv (scripts/install.sh calls this), cmake and a C++ compiler. 10.5 min on 2 cores with
# one build job beside two model processes (MHQA_BUILD_JOBS=N; default: every core).
# Usage: bash scripts/llama_server.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
[ -n "${VIRTUAL_ENV:-}" ] || . .venv/bin/activate
read -r version target < <(python -c \
  "from mhqa_graph.models.server import LLAMA_CPP_VERSION as v, built_binary as b; print(v, b())")
[ -n "${target:-}" ] || { echo "llama-server: mhqa_graph is not importable here; run scripts/install.sh" >&2; exit 1; }
# shellcheck disable=SC1091
. scripts/llama_flags.sh
flags="CFLAGS=${CFLAGS:-} CXXFLAGS=${CXXFLAGS:-}"
built() {  # a working binary built with these flags (one built with others, e.g. with AMX, is built again)
  [ -x "$target" ] && "$target" --version >/dev/null 2>&1 && [ "$(cat "$target.flags" 2>/dev/null)" = "$flags" ]
}
if built; then
  echo "llama-server: already built ($target)"
  exit 0
fi
mkdir -p "$(dirname "$target")"
exec 9>"$(dirname "$target")/.build.lock"
flock 9  # one build at a time; a second caller waits, then finds the binary
if built; then
  echo "llama-server: built meanwhile ($target)"
  exit 0
fi
command -v cmake >/dev/null || python -m pip install -q cmake
work="$(mktemp -d "$(dirname "$target")/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
echo "llama-server: building from llama-cpp-python $version's llama.cpp (once; several minutes)"
python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work" "llama_cpp_python-$version/vendor/llama.cpp"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
# Static, CPU only, AMX off (CFLAGS and CXXFLAGS from llama_flags.sh), no HTTPS, no web UI (it would download).
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF >"$work/cmake.log" 2>&1 || { tail -30 "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "${MHQA_BUILD_JOBS:-$(nproc)}" >"$work/build.log" 2>&1 \
  || { tail -30 "$work/build.log" >&2; exit 1; }
"$work/build/bin/llama-server" --version >/dev/null 2>&1
mv "$work/build/bin/llama-server" "$target.tmp" && mv "$target.tmp" "$target"
echo "$flags" > "$target.flags"
elapsed=$(( $(date +%s) - started ))
echo "llama-server: built $target in $(( elapsed / 60 )) min $(( elapsed % 60 )) s"
