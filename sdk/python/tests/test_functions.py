"""The SDK's function-tier calls against the fake daemon: what they send, how answers parse,
that a run retries without an idempotency key, and the asyncio twins."""
import asyncio
import base64

import pytest

import tidepool


def last(fake, path):
    return [r for r in fake.requests if r.path == path][-1]


def test_run_code_sends_the_contract_fields(client, fake):
    r = client.run_code("python", "print(input())", stdin="hi", timeout=2.5, memory_mb=128,
                        files={"a.txt": b"\x00\x01", "b.txt": "text"}, args=["x"], env={"K": "v"},
                        fetch_files=["out"], compile_timeout=3, max_output_bytes=4096)
    body = last(fake, "/v1/functions/run").json()
    assert body == {"language": "python", "source": "print(input())", "stdin": "hi", "timeout": 2.5,
                    "compile_timeout": 3.0, "memory_mb": 128, "max_output_bytes": 4096,
                    "files": {"a.txt": base64.b64encode(b"\x00\x01").decode(), "b.txt": base64.b64encode(b"text").decode()},
                    "args": ["x"], "env": {"K": "v"}, "fetch_files": ["out"]}
    assert isinstance(r, tidepool.RunResult)
    assert r.ok and r.verdict == "ok" and r.exit_code == 0 and r.stdout == "hi"
    assert r.files == {"echo": b"hi"} and r.wall_time == pytest.approx(0.0015)
    assert r.server_time == pytest.approx(0.002)


def test_bytes_stdin_and_non_utf8_output(client, fake):
    r = client.run_code("python", "x", stdin=b"\xff\xfe")
    assert "stdin_b64" in last(fake, "/v1/functions/run").json()
    assert r.stdout_bytes == b"\xff\xfe"


def test_compile_step_parsed(client):
    r = client.run_code("cpp", "int main(){}")
    assert r.compile is not None and r.compile.ok and r.compile.stderr == "warn"
    assert r.compile.wall_time == pytest.approx(0.1)


def test_a_run_carries_no_idempotency_key_unless_given(client, fake):
    client.run_code("python", "1")
    assert "idempotency-key" not in last(fake, "/v1/functions/run").headers
    client.run_code("python", "1", idempotency_key="traj-1/step-2")
    assert last(fake, "/v1/functions/run").headers["idempotency-key"] == "traj-1/step-2"


def test_a_lost_answer_is_retried_without_a_key(client, fake):
    fake.drop = 1  # handled, answer lost
    r = client.run_code("python", "1", stdin="again")
    assert r.stdout == "again"
    assert len([q for q in fake.requests if q.path == "/v1/functions/run"]) == 2


def test_errors_are_exceptions(client):
    with pytest.raises(tidepool.Unavailable):
        client.run_code("fail", "x")
    with pytest.raises(TypeError):
        client.run_code("python", b"bytes source")


def test_batch_of_cases_sends_the_program_once(client, fake):
    results = client.run_code_batch([{"stdin": "1"}, {"stdin": "2"}], language="cpp", source="int main(){}")
    body = last(fake, "/v1/functions/batch").json()
    assert body["source"] == "int main(){}" and body["cases"] == [{"stdin": "1"}, {"stdin": "2"}]
    assert [r.stdout for r in results] == ["1", "2"]


def test_batch_of_programs_and_failed_items(client, fake):
    results = client.run_code_batch([{"language": "python", "source": "a", "stdin": "A"},
                                     {"language": "fail", "source": "b"}], timeout=1)
    body = last(fake, "/v1/functions/batch").json()
    assert [r["timeout"] for r in body["runs"]] == [1.0, 1.0]
    assert results[0].stdout == "A"
    assert isinstance(results[1], tidepool.Unavailable)
    with pytest.raises(TypeError):
        client.run_code_batch([{"language": "python", "source": "a", "colour": 1}])
    with pytest.raises(ValueError):
        client.run_code_batch([])


def test_languages_and_status(client):
    assert client.fn_languages()[0]["name"] == "python"
    assert client.fn_status()["queued"] == 0


def test_asyncio_twins(fake):
    async def main():
        async with tidepool.AsyncClient(fake.url, timeout=10) as c:
            a = await c.run_code("python", "x", stdin="async")
            b = await c.run_code_batch([{"stdin": "1"}], language="python", source="x")
            return a, b, await c.fn_languages()
    a, b, langs = asyncio.run(main())
    assert a.stdout == "async" and b[0].stdout == "1" and langs[0]["name"] == "python"
