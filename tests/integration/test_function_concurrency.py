"""The function tier under concurrent clients, in batches, from the asyncio SDK, and what
/metrics says about it (docs/function-tier.md).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import re

import pytest

from fn_lib import fn, fn_clean  # noqa: F401  (fixtures)

import tidepool

SQUARE_PY = "n = int(input())\nprint(n * n)"
SQUARE_CPP = "#include <iostream>\nint main(){long n; std::cin >> n; std::cout << n * n << std::endl;}"


def test_eight_concurrent_clients_get_their_own_answers(fn_clean, make_client):
    clients = [make_client(timeout=120) for _ in range(8)]

    def work(k):
        c = clients[k]
        out = []
        for i in range(25):
            n = k * 1000 + i
            lang, src = (("python", SQUARE_PY), ("bash", "read n; echo $((n*n))"))[i % 2]
            r = c.run_code(lang, src, stdin=f"{n}\n")
            out.append((n, r))
        return out

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        results = [r for chunk in ex.map(work, range(8)) for r in chunk]
    assert len(results) == 200
    for n, r in results:
        assert r.verdict == "ok" and r.stdout == f"{n * n}\n", (n, r)


def test_batch_of_cases(fn_clean):
    before = fn_clean.fn_status()["compile_cache"]["misses"]
    results = fn_clean.run_code_batch([{"stdin": f"{i}\n"} for i in range(100)], language="cpp", source=SQUARE_CPP)
    assert len(results) == 100
    for i, r in enumerate(results):
        assert isinstance(r, tidepool.RunResult) and r.ok and r.stdout == f"{i * i}\n", (i, r)
        assert r.compile is not None and r.compile.ok
    assert fn_clean.fn_status()["compile_cache"]["misses"] == before + 1  # compiled once


def test_batch_of_programs_in_order(fn_clean):
    runs = [{"language": "python", "source": "print('a')"},
            {"language": "bash", "source": "echo b"},
            {"language": "c", "source": "int main(){ return 5; }"},
            {"language": "nodejs", "source": "console.log('d')"}]
    results = fn_clean.run_code_batch(runs)
    assert [r.stdout for r in results] == ["a\n", "b\n", "", "d\n"]
    assert results[2].verdict == "runtime_error" and results[2].exit_code == 5
    with pytest.raises(tidepool.InvalidArgument, match="run 1"):
        fn_clean.run_code_batch([{"language": "python", "source": "1"}, {"language": "cobol", "source": "1"}])


def test_asyncio_client(daemon, fn_clean):
    async def main():
        async with tidepool.AsyncClient(daemon.url, timeout=120) as c:
            rs = await asyncio.gather(*(c.run_code("python", SQUARE_PY, stdin=f"{i}\n") for i in range(40)))
            batch = await c.run_code_batch([{"stdin": "7\n"}, {"stdin": "8\n"}], language="python", source=SQUARE_PY)
            langs = await c.fn_languages()
            return rs, batch, langs
    rs, batch, langs = asyncio.run(main())
    assert [r.stdout for r in rs] == [f"{i * i}\n" for i in range(40)]
    assert [r.stdout for r in batch] == ["49\n", "64\n"]
    assert {"python", "cpp", "c", "nodejs", "bash"} <= {l["name"] for l in langs}


def test_metrics_show_queue_rate_and_verdicts(fn_clean):
    fn_clean.run_code("python", "print(1)")
    fn_clean.run_code("python", "while True: pass", timeout=0.2)
    text = fn_clean.metrics()
    assert re.search(r"^tidepool_fn_queue_depth \d+$", text, re.M)
    assert re.search(r"^tidepool_fn_calls_per_second [\d.]+$", text, re.M)
    ok = int(re.search(r'^tidepool_fn_verdicts_total\{verdict="ok"\} (\d+)$', text, re.M).group(1))
    tle = int(re.search(r'^tidepool_fn_verdicts_total\{verdict="time_limit"\} (\d+)$', text, re.M).group(1))
    assert ok >= 1 and tle >= 1
    assert re.search(r'^tidepool_fn_workers\{state="ready"\} [1-9]', text, re.M)
    st = fn_clean.fn_status()
    assert st["runs_total"] >= 2 and st["verdicts"]["time_limit"] >= 1


def test_per_client_limit_and_queue(daemon, fn_clean, make_client):
    """More concurrent calls than one client may run: all complete, none in parallel with
    more than the limit (the status never shows more in flight for the pool than slots)."""
    c = make_client(timeout=120)
    limit = c.fn_status()["config"]["per_client_in_flight"]
    n = limit * 2 + 4
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        futs = [ex.submit(c.run_code, "python", "import time; time.sleep(0.3); print('z')") for _ in range(n)]
        seen = 0
        for _ in range(20):
            st = c.fn_status()
            seen = max(seen, st["in_flight"])
            assert st["in_flight"] <= limit, st
        results = [f.result() for f in futs]
    assert all(r.stdout == "z\n" for r in results)
