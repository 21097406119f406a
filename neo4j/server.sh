#!/usr/bin/env bash
# A local Neo4j Community server from Maven Central jars, for the live tests and for users without Docker.
#
#   bash neo4j/server.sh start    # fetch the jars once, start on 127.0.0.1 with a fresh data folder, wait for Bolt
#   bash neo4j/server.sh status   # running or not, and the exports to use
#   bash neo4j/server.sh stop     # SIGTERM, clean shutdown
#   eval "$(bash neo4j/server.sh start)"   # start, then export NEO4J_URI (and credentials) in this shell
#
# Progress goes to stderr; stdout carries only the `export` lines. Settings (environment):
#   MHQA_NEO4J_HOME      jars, config, data and logs (default ~/.cache/mhqa-neo4j; never in git)
#   MHQA_NEO4J_PORT      Bolt port on 127.0.0.1 (default 7687)
#   MHQA_NEO4J_PASSWORD  turn auth on with this password for user neo4j (8+ characters); unset: auth off
#   MHQA_NEO4J_VERSION   org.neo4j:neo4j version (default: the pom's, 5.26 LTS on Java 17)
#   MHQA_NEO4J_HEAP / MHQA_NEO4J_PAGECACHE   JVM heap and page cache (default 2g / 1g)
#   MHQA_NEO4J_WAIT      seconds to wait for Bolt (default 120)
#   JAVA_HOME            the JDK to run (2025.x needs Java 21+, 2025.10+ Java 21 or 25)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(dirname "$HERE")"
CACHE="${MHQA_NEO4J_HOME:-$HOME/.cache/mhqa-neo4j}"
PORT="${MHQA_NEO4J_PORT:-7687}"
PASSWORD="${MHQA_NEO4J_PASSWORD:-}"
HEAP="${MHQA_NEO4J_HEAP:-2g}"
PAGECACHE="${MHQA_NEO4J_PAGECACHE:-1g}"
WAIT="${MHQA_NEO4J_WAIT:-120}"
POM_VERSION="$(sed -n 's:.*<neo4j.version>\(.*\)</neo4j.version>.*:\1:p' "$HERE/pom.xml")"
VERSION="${MHQA_NEO4J_VERSION:-$POM_VERSION}"
RUN="$CACHE/server-$PORT"  # one instance per port: conf/, data/, logs/, run/, console.log, pid
JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"

say() { echo "neo4j/server.sh: $*" >&2; }
die() { say "$*"; exit 1; }

running_pid() {  # the pid of this port's server, if it is alive
  local pid
  [ -f "$RUN/pid" ] || return 1
  pid="$(cat "$RUN/pid")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

exports() {
  echo "export NEO4J_URI=neo4j://127.0.0.1:$PORT"
  if [ -n "$(cat "$RUN/auth" 2>/dev/null)" ]; then
    echo "export NEO4J_USER=neo4j"
    printf 'export NEO4J_PASSWORD=%q\n' "$(cat "$RUN/auth")"
  fi
}

show_log() {
  say "last lines of $RUN/console.log:"
  tail -n "${1:-60}" "$RUN/console.log" >&2 2>/dev/null || true
  if [ -f "$RUN/logs/debug.log" ] && grep -qE "ERROR|Exception" "$RUN/logs/debug.log"; then
    say "errors in $RUN/logs/debug.log:"
    grep -E "ERROR|Exception" "$RUN/logs/debug.log" | tail -n 20 >&2
  fi
}

python_with_driver() {  # a Python that imports the neo4j driver: the project's .venv first
  local py
  for py in "${MHQA_NEO4J_PYTHON:-}" "$REPO/.venv/bin/python" python3; do
    [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 && "$py" -c "import neo4j" 2>/dev/null && { echo "$py"; return 0; }
  done
  return 1
}

fetch_jars() {  # $CACHE/<version>/lib: the runtime jars of org.neo4j:neo4j, copied once
  local lib="$CACHE/$VERSION/lib" start
  [ -f "$lib/.complete" ] && return 0
  command -v mvn >/dev/null || die "needs Maven (apt-get install maven) to fetch Neo4j $VERSION from Maven Central"
  say "fetching Neo4j $VERSION and its dependencies from Maven Central into $lib (once)"
  start=$(date +%s)
  rm -rf "$lib.part"
  mvn -B -q -Dstyle.color=never -f "$HERE/pom.xml" -Dneo4j.version="$VERSION" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$lib.part" >&2 || die "Maven could not fetch org.neo4j:neo4j:$VERSION"
  rm -rf "$lib" && mv "$lib.part" "$lib" && touch "$lib/.complete"
  say "fetched $(find "$lib" -name '*.jar' | wc -l) jars ($(du -sh "$lib" | cut -f1)) in $(( $(date +%s) - start )) s"
}

write_conf() {
  mkdir -p "$RUN/conf"
  cat > "$RUN/conf/neo4j.conf" <<EOF
# Written by neo4j/server.sh for Neo4j $VERSION; rewritten on every start.
server.directories.data=$RUN/data
server.directories.logs=$RUN/logs
server.directories.run=$RUN/run
server.directories.plugins=$RUN/plugins
server.directories.import=$RUN/import
server.default_listen_address=127.0.0.1
server.default_advertised_address=127.0.0.1
server.bolt.enabled=true
server.bolt.listen_address=127.0.0.1:$PORT
server.bolt.advertised_address=127.0.0.1:$PORT
server.http.enabled=false
server.https.enabled=false
dbms.security.auth_enabled=$([ -n "$PASSWORD" ] && echo true || echo false)
dbms.usage_report.enabled=false
# Keys an older or newer version does not know (5.18 has no dbms.usage_report.enabled) are warned about, not fatal.
server.config.strict_validation.enabled=false
server.memory.heap.initial_size=$HEAP
server.memory.heap.max_size=$HEAP
server.memory.pagecache.size=$PAGECACHE
db.tx_log.rotation.retention_policy=1 files
EOF
}

wait_ready() {  # over Bolt: RETURN 1 on database neo4j; sets the password first when auth is on
  local pid="$1" py="$2"
  MHQA_PID="$pid" MHQA_PORT="$PORT" MHQA_WAIT="$WAIT" MHQA_PW="$PASSWORD" "$py" - <<'EOF'
import os, sys, time
import neo4j
from neo4j.exceptions import AuthError, Neo4jError, ServiceUnavailable, SessionExpired

pid, uri, wait, pw = int(os.environ["MHQA_PID"]), f"bolt://127.0.0.1:{os.environ['MHQA_PORT']}", \
    float(os.environ["MHQA_WAIT"]), os.environ["MHQA_PW"]
auth = ("neo4j", pw) if pw else None
start = time.monotonic()

def alive():
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False

def ask(auth, database="neo4j", query="RETURN 1", **params):  # one try, no driver retries
    with neo4j.GraphDatabase.driver(uri, auth=auth, connection_timeout=3) as driver, \
            driver.session(database=database) as session:
        session.run(query, params).consume()

while True:
    if not alive():
        sys.exit(2)
    if time.monotonic() - start > wait:
        sys.exit(3)
    try:
        ask(auth)
        sys.exit(0)
    except (ServiceUnavailable, SessionExpired, OSError):
        time.sleep(1)
    except AuthError:
        if not pw:
            raise
        # a fresh data folder: the initial password 'neo4j' must be changed before anything else runs
        ask(("neo4j", "neo4j"), "system", "ALTER CURRENT USER SET PASSWORD FROM 'neo4j' TO $pw", pw=pw)
    except Neo4jError as e:  # e.g. the database still starting
        if "DatabaseUnavailable" not in (e.code or "") and "Unavailable" not in (e.code or ""):
            print(f"neo4j/server.sh: {e.code}: {e.message}", file=sys.stderr)
        time.sleep(1)
EOF
}

start() {
  local pid py status started
  if pid="$(running_pid)"; then
    die "a server already runs on port $PORT (pid $pid); stop it first: MHQA_NEO4J_PORT=$PORT bash neo4j/server.sh stop"
  fi
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    die "port $PORT on 127.0.0.1 is taken by another process; pick another: MHQA_NEO4J_PORT=7688 bash neo4j/server.sh start"
  fi
  if [ -n "$PASSWORD" ] && [ "${#PASSWORD}" -lt 8 ]; then
    die "MHQA_NEO4J_PASSWORD must have 8 or more characters (Neo4j's minimum), or be unset for a server without auth"
  fi
  command -v "$JAVA" >/dev/null || die "needs Java 17+ (set JAVA_HOME, or apt-get install openjdk-17-jre-headless)"
  py="$(python_with_driver)" || die "needs the neo4j Python driver to check readiness: bash scripts/install.sh neo4j (or pip install neo4j)"
  fetch_jars
  rm -rf "$RUN"  # a fresh data folder on every start
  mkdir -p "$RUN/data" "$RUN/logs" "$RUN/run" "$RUN/plugins" "$RUN/import"
  write_conf
  printf '%s' "$PASSWORD" > "$RUN/auth" && chmod 600 "$RUN/auth"
  say "starting Neo4j $VERSION ($("$JAVA" -version 2>&1 | head -1)) on 127.0.0.1:$PORT, heap $HEAP, page cache $PAGECACHE"
  started=$(date +%s)
  # The JVM flags of the stock neo4j.conf (server.jvm.additional), which only the `neo4j` launcher reads.
  setsid nohup "$JAVA" -Xms"$HEAP" -Xmx"$HEAP" -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError -XX:-OmitStackTraceInFastThrow \
    -XX:+UnlockExperimentalVMOptions -XX:+TrustFinalNonStaticFields -XX:+DisableExplicitGC \
    -Djdk.nio.maxCachedBufferSize=1024 -Dio.netty.tryReflectionSetAccessible=true \
    -Djdk.tls.ephemeralDHKeySize=2048 -Djdk.tls.rejectClientInitiatedRenegotiation=true \
    -XX:FlightRecorderOptions=stackdepth=256 -XX:+UnlockDiagnosticVMOptions -XX:+DebugNonSafepoints \
    --add-opens=java.base/java.nio=ALL-UNNAMED --add-opens=java.base/java.io=ALL-UNNAMED \
    --add-opens=java.base/sun.nio.ch=ALL-UNNAMED --add-opens=java.base/java.lang=ALL-UNNAMED \
    --enable-native-access=ALL-UNNAMED -Dlog4j2.disable.jmx=true -Dfile.encoding=UTF-8 \
    -cp "$CACHE/$VERSION/lib/*" org.neo4j.server.CommunityEntryPoint \
    --home-dir="$RUN" --config-dir="$RUN/conf" --console-mode \
    </dev/null >"$RUN/console.log" 2>&1 &
  pid=$!
  echo "$pid" > "$RUN/pid"
  status=0
  wait_ready "$pid" "$py" || status=$?
  case "$status" in
    0) say "Neo4j $VERSION ready on bolt://127.0.0.1:$PORT in $(( $(date +%s) - started )) s (pid $pid, log $RUN/console.log)"
       exports ;;
    2) show_log; rm -f "$RUN/pid"; die "Neo4j exited before accepting Bolt connections (log above)" ;;
    3) show_log; stop >/dev/null 2>&1 || true; die "Neo4j did not answer on bolt://127.0.0.1:$PORT within $WAIT s (log above); stopped it" ;;
    *) show_log; stop >/dev/null 2>&1 || true; die "the readiness check failed (exit $status); stopped the server" ;;
  esac
}

stop() {
  local pid start
  if ! pid="$(running_pid)"; then
    say "no server runs on port $PORT"
    rm -f "$RUN/pid"
    return 0
  fi
  kill -TERM "$pid"
  start=$(date +%s)
  for _ in $(seq 1 120); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$RUN/pid"; say "stopped (pid $pid) in $(( $(date +%s) - start )) s"; return 0; }
    sleep 0.5
  done
  say "pid $pid did not stop within 60 s of SIGTERM; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$RUN/pid"
  return 1
}

status() {
  local pid
  if pid="$(running_pid)"; then
    say "running: pid $pid, bolt://127.0.0.1:$PORT, Neo4j $(sed -n 's/^# Written by neo4j\/server.sh for Neo4j \([^;]*\);.*/\1/p' "$RUN/conf/neo4j.conf"), files in $RUN"
    exports
  else
    say "not running on port $PORT"
    return 3
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: bash neo4j/server.sh start|stop|status   (settings: see the top of this file)" >&2; exit 2 ;;
esac
