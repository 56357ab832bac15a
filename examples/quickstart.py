"""The five-line example from the README: one sandbox, one file, one command.

Run against a daemon started with `make run`:

    PYTHONPATH=sdk/python /usr/bin/python3 examples/quickstart.py
"""
import tidepool

client = tidepool.Client()                      # TIDEPOOL_URL or http://127.0.0.1:7070
with client.create(image="host", memory_mb=512, ttl=600) as sb:
    sb.files.write("/tmp/hello.py", "print(6 * 7)\n")
    print(sb.exec(["python3", "/tmp/hello.py"]).stdout)   # 42
