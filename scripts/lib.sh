# Shared by scripts/demo.sh and scripts/test.sh: install what is missing, start what is stopped.
# Works as root or as a user with sudo, on Debian 12 (and derivatives) with Python 3.10+.

PYTHON=${PYTHON:-python3}
VENV=${JOBQUEUE_VENV:-.venv}

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}

as_user() {  # as_user USER CMD...: run CMD as USER from a directory USER can read
  local user=$1; shift
  if [ "$(id -u)" -eq 0 ]; then (cd /tmp && runuser -u "$user" -- "$@"); else (cd /tmp && sudo -n -u "$user" "$@"); fi
}

deb_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

ensure_debs() {  # ensure_debs PKG...: apt-get install the ones that are missing
  local missing=() pkg
  for pkg in "$@"; do deb_installed "$pkg" || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

ensure_pgbouncer() {  # Debian's pgbouncer, which the tests start themselves, on ports of their own
  deb_installed pgbouncer && return 0
  ensure_debs pgbouncer
  # The package enables a system pgbouncer on port 6432 and starts it where it can: not wanted here.
  as_root systemctl disable pgbouncer.service >/dev/null 2>&1 || true
  as_root service pgbouncer stop >/dev/null 2>&1 || true
}

ensure_java() {  # Java 17 or later, for Spark
  local version
  version=$(java -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -1 || true)
  [ -n "$version" ] && [ "$version" -ge 17 ] && return 0
  ensure_debs openjdk-17-jre-headless
}

ensure_python() {  # a Python >= 3.10 with venv, and headers when C extensions must build ($1 = yes)
  command -v "$PYTHON" >/dev/null || ensure_debs python3
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 10), sys.version' \
    || { echo "jobqueue needs Python 3.10 or newer; set PYTHON=/path/to/python3.x" >&2; exit 1; }
  "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || ensure_debs python3-venv
  if [ "${1:-no}" = yes ]; then
    "$PYTHON" -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
      2>/dev/null || ensure_debs python3-dev
  fi
}

ensure_venv() {  # ensure_venv PIP-SPEC...: a virtualenv in $VENV with these installed
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  say "installing Python packages into $VENV: $*"
  local log="$VENV/pip-install.log"
  if ! { "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip \
         && "$VENV/bin/python" -m pip install --disable-pip-version-check -e "$@"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "pip install failed (log above, also in $log)" >&2
    exit 1
  fi
}

wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  local seconds=$1 what=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then echo "$what did not come up within ${seconds}s" >&2; return 1; fi
    sleep 0.5
  done
}

start_postgres() {
  if ! pg_isready -h 127.0.0.1 -p 5432 -q >/dev/null 2>&1; then
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    say "starting PostgreSQL $version"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start
  fi
  wait_for 60 PostgreSQL pg_isready -h 127.0.0.1 -p 5432 -q
}

start_mariadb() {
  if ! mariadb-admin ping -h 127.0.0.1 --silent >/dev/null 2>&1; then
    say "starting MariaDB"
    as_root mkdir -p /run/mysqld
    as_root chown mysql:mysql /run/mysqld
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  fi
  wait_for 60 MariaDB mariadb-admin ping -h 127.0.0.1 --silent
}

psql_admin() {  # TCP as postgres where trust auth allows it, else the postgres OS user over the socket
  if psql -h 127.0.0.1 -U postgres -d postgres -tAc 'SELECT 1' >/dev/null 2>&1; then
    psql -h 127.0.0.1 -U postgres -d postgres "$@"
  else
    as_user postgres psql -d postgres "$@"
  fi
}

mysql_admin() {  # TCP as root where allowed, else root over the socket (Debian's unix_socket auth)
  if mariadb -h 127.0.0.1 -u root -e 'SELECT 1' >/dev/null 2>&1; then
    mariadb -h 127.0.0.1 -u root "$@"
  else
    as_root mariadb -u root "$@"
  fi
}

create_test_roles() {  # a login of our own on each server; the tests create and drop only their own databases
  psql_admin -v ON_ERROR_STOP=1 -qc "DO \$\$ BEGIN
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobqueue_test') THEN
        CREATE ROLE jobqueue_test LOGIN CREATEDB PASSWORD 'jobqueue_test';
      END IF; END \$\$;"
  local host
  for host in localhost 127.0.0.1; do
    mysql_admin -e "CREATE USER IF NOT EXISTS 'jobqueue_test'@'$host' IDENTIFIED BY 'jobqueue_test';
      GRANT ALL PRIVILEGES ON \`jobqueue\\_test%\`.* TO 'jobqueue_test'@'$host';"
  done
}
