"""fedlib.runlock: a stale Snakemake lock (its run killed with kill -9) is removed by the next
run, and the lock of a run that is alive never is."""

import subprocess
import sys

CLAIM = ("import sys, time\nfrom pathlib import Path\nfrom fedlib.runlock import claim_workdir\n"
         "print(claim_workdir(Path(sys.argv[1])), flush=True)\n")


def claim(snakemake_dir, hold=False):
    """A process that claims the directory: (what claim_workdir returned, the process if it holds on)."""
    script = CLAIM + ("time.sleep(600)\n" if hold else "")
    proc = subprocess.Popen([sys.executable, "-c", script, str(snakemake_dir)], stdout=subprocess.PIPE, text=True)
    removed = proc.stdout.readline().strip()
    if not hold:
        assert proc.wait() == 0
    return removed == "True", proc


def stale_lock(snakemake_dir):
    (snakemake_dir / "locks").mkdir(parents=True, exist_ok=True)
    (snakemake_dir / "locks" / "0.output.lock").write_text("results/x.json\n")


def test_a_lock_nobody_holds_is_removed(tmp_path):
    snakemake_dir = tmp_path / ".snakemake"
    assert claim(snakemake_dir)[0] is False  # no lock: nothing to remove
    stale_lock(snakemake_dir)
    removed, _ = claim(snakemake_dir)
    assert removed and not (snakemake_dir / "locks").exists()


def test_the_lock_of_a_live_run_stays_until_it_is_killed(tmp_path):
    snakemake_dir = tmp_path / ".snakemake"
    removed, running = claim(snakemake_dir, hold=True)
    try:
        assert not removed
        stale_lock(snakemake_dir)  # the live run's lock
        assert claim(snakemake_dir)[0] is False and (snakemake_dir / "locks" / "0.output.lock").exists()
        _, second = claim(snakemake_dir, hold=True)  # two live runs: neither removes anything
        second.kill()
        second.wait()
        assert claim(snakemake_dir)[0] is False and (snakemake_dir / "locks").exists()
    finally:
        running.kill()  # kill -9: the kernel drops its flock
        running.wait()
    removed, _ = claim(snakemake_dir)
    assert removed and not (snakemake_dir / "locks").exists()
