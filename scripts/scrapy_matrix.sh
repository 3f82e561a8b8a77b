#!/usr/bin/env bash
# Run the Scrapy-facing tests again on older Scrapy versions, each in its own venv
# (.venv/scrapy-<version>): the engine internals redcrawl hooks differ between versions.
# SCRAPY_MATRIX_VERSIONS="2.11.2 2.13.4" (the default) picks the versions; "" skips.
# SCRAPY_MATRIX_MARK: a pytest -m expression (scripts/test.sh runs "not serial" alongside
# its parallel phase and "serial" in its serial phase); SCRAPY_MATRIX_INSTALLED=1 skips the
# pip step (the venvs are up to date: the first pass just installed them).
set -euo pipefail
cd "$(dirname "$0")/.."
versions="${SCRAPY_MATRIX_VERSIONS-2.11.2 2.13.4}"
tests=(tests/test_codec.py tests/test_crawl_e2e.py tests/test_scheduler.py tests/test_migration.py
       tests/test_start_entries.py tests/test_meta_types.py tests/test_callback_rule.py
       tests/test_start_claim.py tests/test_layout_refusal.py tests/test_spider_refusal.py
       tests/test_addon.py)
# Not run again here: the streams variant of the SIGKILL crawl (about 55 s per version, a
# sixth of the matrix). redcrawl's Scrapy side (scheduler, dupefilter, spiders, add-on)
# has no backend-specific code: the backend is the frontier's storage in Redis, the same
# whatever Scrapy runs it (src/redcrawl/scrapy/ calls the frontier's interface only). The
# lists variant still SIGKILLs a worker mid-crawl on every version; the streams one runs on
# the current Scrapy in the main phase.
# Nor the tests of these files that touch no Scrapy API at all (Lua scripts and msgpack
# only; about 6 s per version, and no Redis Cluster to start): the start-key claims on a
# cluster and through a reply-dropping proxy, and decoding random bytes and maps into
# envelopes (test_codec's round trips through scrapy.Request stay).
deselect=(
  --deselect "tests/test_crawl_e2e.py::test_three_workers_one_sigkilled_crawl_completes[streams]"
  --deselect tests/test_start_claim.py::test_claims_work_on_a_redis_cluster
  --deselect tests/test_start_claim.py::test_a_claim_whose_reply_is_lost_is_answered_with_the_same_batch
  --deselect tests/test_codec.py::test_decode_random_bytes_only_ever_raises_decode_error
  --deselect tests/test_codec.py::test_decode_random_maps_only_ever_raises_decode_error
)
failed=0
present=()
for t in "${tests[@]}"; do [ -f "$t" ] && present+=("$t"); done
for v in $versions; do
  venv=".venv/scrapy-$v"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  pins=("scrapy==$v")
  case "$v" in 2.11.*) pins+=("w3lib<2.2" "Twisted<24.8");; esac
  echo "== Scrapy $v${SCRAPY_MATRIX_MARK:+ ($SCRAPY_MATRIX_MARK)}"
  if [ -z "${SCRAPY_MATRIX_INSTALLED:-}" ] ||
     ! "$venv/bin/python" -c "import pytest, scrapy, sys; sys.exit(scrapy.__version__ != '$v')" 2>/dev/null; then
    "$venv/bin/pip" install -q --disable-pip-version-check "${pins[@]}" -e ".[test]" "${pins[@]}"
  fi
  rc=0
  "$venv/bin/python" -m pytest -q -p no:cacheprovider ${SCRAPY_MATRIX_MARK:+-m "$SCRAPY_MATRIX_MARK"} \
    "${deselect[@]}" "${present[@]}" || rc=$?
  # 5: the mark selected none of them; a failure still lets the other versions run
  [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || failed=$rc
done
exit "$failed"
