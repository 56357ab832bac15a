"""CI's short soak: 50 sandboxes with mixed exec and file traffic for 60 s against the
suite's daemon; zero errors, daemon RSS and fd count flat after warm-up (soak.py has the
criteria; the documented long run is `tests/soak/soak.py --sandboxes 500 --minutes 10`).

TIDEPOOL_SOAK_SANDBOXES / TIDEPOOL_SOAK_SECONDS change the size."""
import os

import soak


def test_short_soak(daemon):
    n = int(os.environ.get("TIDEPOOL_SOAK_SANDBOXES", "50"))
    seconds = float(os.environ.get("TIDEPOOL_SOAK_SECONDS", "60"))
    s = soak.Soak(daemon.url, daemon.pid, n, seconds, workers=8, sample_every=1.0, log=lambda m: None)
    try:
        s.run()
    finally:
        daemon.created.update(s.ids)
    problems = soak.verdict(s, warmup=0.25, rss_slack_mb=16, rss_slack_pct=10, fd_slack=8)
    ops = sum(s.ops.values())
    assert len(s.ids) == n, s.errors[:5]
    assert ops > 0
    assert not problems, f"{ops} ops {s.ops}; samples {s.samples}; " + "; ".join(problems)
