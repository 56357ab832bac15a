"""Readings of the host's memory counters that more than one bench script takes."""


def meminfo_kb() -> dict:
    """/proc/meminfo as {field: kB}."""
    m = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            m[k] = int(v.split()[0])
    return m


def slab_kb(cache: str) -> float:
    """kB a slab cache holds (/proc/slabinfo: num_objs x objsize); 0 when unreadable.

    kmalloc-1k holds the kernel's per-memory-cgroup shrinker maps: every memory cgroup
    gets an entry per memcg-aware shrinker the host ever had at once (one per mounted
    superblock: a container's proc, tmpfs, devpts, overlay and mqueue each add one), and
    the maps never shrink until a reboot. So on a host that once held many containers,
    every new memory cgroup costs more; the benches report this apart from their own."""
    try:
        with open("/proc/slabinfo") as f:
            for line in f:
                p = line.split()
                if p and p[0] == cache:
                    return int(p[2]) * int(p[3]) / 1024
    except OSError:
        pass
    return 0.0
