"""SandboxFusion's POST /run_code on the function tier (docs/function-tier.md).

Requests are sent exactly as verl's sandbox_fusion reward client builds them (a JSON
body with compile_timeout, run_timeout, code, stdin, memory_limit_MB, language, files,
fetch_files; no other header than the content type), and the answers are classified
the way that client does (`classify` below restates its rules: SandboxError -> -1;
Failed with a compile step that is Error/TimeLimitExceeded or Finished non-zero -> -4
compile error; Failed with run TimeLimitExceeded -> -3 timeout; Failed with run Error or
Finished non-zero -> -2 runtime error; Success with Finished run -> compare stdout with
trailing newlines stripped: True or False (wrong answer)).
"""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from fn_lib import fn, fn_clean  # noqa: F401  (fixtures)


def run_code(url: str, code: str, stdin: str, language: str, timeout: int = 10, memory_mb: int = 1024,
             **extra):
    payload = {"compile_timeout": timeout, "run_timeout": timeout, "code": code, "stdin": stdin,
               "memory_limit_MB": memory_mb, "language": language, "files": {}, "fetch_files": []}
    payload.update(extra)
    req = urllib.request.Request(url + "/run_code", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json", "Accept": "application/json"},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=timeout * 2 + 10) as r:
        assert r.status == 200
        return json.loads(r.read())


def classify(resp: dict, expected_output: str):
    """verl's result_status for one test case (see the module docstring)."""
    status = resp.get("status")
    compile_result, run_result = resp.get("compile_result"), resp.get("run_result")
    if status == "SandboxError":
        return -1
    if status == "Failed":
        if compile_result and (compile_result.get("status") in ("Error", "TimeLimitExceeded") or
                               (compile_result.get("status") == "Finished" and compile_result.get("return_code") != 0)):
            return -4
        if run_result:
            rs = run_result.get("status")
            if rs == "TimeLimitExceeded":
                return -3
            if rs == "Error" or (rs == "Finished" and run_result.get("return_code") != 0):
                return -2
        return -1
    if status == "Success":
        if run_result and run_result.get("status") == "Finished":
            return str(run_result.get("stdout") or "").rstrip("\n") == str(expected_output).rstrip("\n")
        return -1
    return -1


ADD = {
    "python": "a, b = map(int, input().split())\nprint(a + b)",
    "cpp": "#include <iostream>\nint main(){long a,b; std::cin>>a>>b; std::cout<<a+b<<std::endl;}",
    "nodejs": "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(' ').map(Number); console.log(a + b);",
    "bash": "read a b; echo $((a + b))",
}


@pytest.mark.parametrize("lang", sorted(ADD))
def test_accepted_and_wrong_answer(daemon, fn_clean, lang):
    r = run_code(daemon.url, ADD[lang], "2 3\n", lang)
    assert set(r) >= {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}
    assert r["status"] == "Success", r
    assert r["run_result"]["status"] == "Finished" and r["run_result"]["return_code"] == 0
    assert isinstance(r["run_result"]["execution_time"], float)
    assert classify(r, "5") is True
    assert classify(r, "6") is False  # wrong answer
    if lang == "cpp":
        assert r["compile_result"]["status"] == "Finished" and r["compile_result"]["return_code"] == 0
    else:
        assert r["compile_result"] is None


@pytest.mark.parametrize("lang,code", [
    ("python", "import sys\nsys.exit(2)"),
    ("python", "raise RuntimeError('x')"),
    ("cpp", "#include <cstdlib>\nint main(){ std::abort(); }"),
    ("nodejs", "process.exit(4)"),
    ("bash", "exit 7"),
])
def test_runtime_error(daemon, fn_clean, lang, code):
    r = run_code(daemon.url, code, "", lang)
    assert r["status"] == "Failed", r
    assert r["run_result"]["status"] == "Finished" and r["run_result"]["return_code"] != 0
    assert classify(r, "") == -2
    if lang == "cpp":
        assert r["run_result"]["return_code"] == -6  # SIGABRT, as asyncio reports a signal


@pytest.mark.parametrize("lang,code", [
    ("python", "while True: pass"),
    ("cpp", "int main(){ volatile long x = 0; for(;;) ++x; }"),
])
def test_timeout(daemon, fn_clean, lang, code):
    r = run_code(daemon.url, code, "", lang, timeout=1)
    assert r["status"] == "Failed", r
    assert r["run_result"]["status"] == "TimeLimitExceeded"
    assert r["run_result"]["return_code"] is None
    assert classify(r, "") == -3


def test_compile_error(daemon, fn_clean):
    r = run_code(daemon.url, "int main() { return x; }", "", "cpp")
    assert r["status"] == "Failed", r
    assert r["compile_result"]["status"] == "Finished" and r["compile_result"]["return_code"] != 0
    assert "error" in r["compile_result"]["stderr"]
    assert r["run_result"] is None
    assert classify(r, "") == -4


def test_memory_limit_is_a_killed_run(daemon, fn_clean):
    r = run_code(daemon.url, "x = bytearray(512 << 20)\nprint(len(x))", "", "python", memory_mb=128)
    assert r["status"] == "Failed", r
    assert r["run_result"]["status"] == "Finished" and r["run_result"]["return_code"] == -9
    assert classify(r, "") == -2


def test_files_and_fetch_files(daemon, fn_clean):
    r = run_code(daemon.url, "print(open('in.txt').read().upper()); open('out.txt', 'w').write('o')", "", "python",
                 files={"in.txt": base64.b64encode(b"abc").decode(), "skip.txt": None},
                 fetch_files=["out.txt", "missing.txt"])
    assert r["status"] == "Success", r
    assert r["run_result"]["stdout"] == "ABC\n"
    assert r["files"] == {"out.txt": base64.b64encode(b"o").decode()}


def test_language_not_served_and_unknown(daemon, fn_clean):
    r = run_code(daemon.url, "package main", "", "go")
    assert r["status"] == "SandboxError" and "not served" in r["message"]
    assert classify(r, "") == -1
    with pytest.raises(urllib.error.HTTPError) as e:
        run_code(daemon.url, "x", "", "klingon")
    assert e.value.code == 422
    detail = json.loads(e.value.read())["detail"]
    assert detail[0]["type"] == "literal_error" and detail[0]["loc"] == ["body", "language"]


def test_missing_code_is_422(daemon, fn_clean):
    req = urllib.request.Request(daemon.url + "/run_code", data=b'{"language": "python"}',
                                 headers={"Content-Type": "application/json"}, method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 422
    assert json.loads(e.value.read())["detail"][0]["loc"] == ["body", "code"]


def test_one_program_many_cases_compiles_once(daemon, fn_clean):
    """verl sends one request per test case, all with the same code, at once."""
    import concurrent.futures
    src = "#include <iostream>\nint main(){long n; std::cin>>n; std::cout<<n*n<<std::endl;} // many"
    before = fn_clean.fn_status()["compile_cache"]["misses"]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        rs = list(ex.map(lambda i: run_code(daemon.url, src, f"{i}\n", "cpp"), range(16)))
    for i, r in enumerate(rs):
        assert classify(r, str(i * i)) is True, r
    assert fn_clean.fn_status()["compile_cache"]["misses"] == before + 1
