"""Run the shared peer harness's `goqueue_bench.py` with a given `goqueue` and a label, so
that two builds (before and after a change) run side by side in one `run_all.sh` run:

    cd ../shared/bench-peers && N=5000 REPS=5 ./run_all.sh ceiling_bench.py \\
      "$OLD/benchmarks/labelled_peer.py before $OLD/.venv/bin/goqueue" \\
      "$NEW/benchmarks/labelled_peer.py after $NEW/.venv/bin/goqueue"

Arguments: LABEL GOQUEUE_BIN [goqueue_bench.py options]. The row is named
`goqueue[LABEL]` (or `goqueue-pg[LABEL]`). `BENCH_PEERS` names the harness folder
(default: the working directory, where `run_all.sh` runs its peers).
"""

import os
import runpy
import sys

if __name__ == "__main__":
    peers = os.path.abspath(os.environ.get("BENCH_PEERS", "."))
    sys.path.insert(0, peers)
    label, binary = sys.argv[1], sys.argv[2]
    sys.argv = [os.path.join(peers, "goqueue_bench.py"), *sys.argv[3:]]
    os.environ["GOQUEUE_BIN"] = binary
    import common  # the harness's own module, shared with goqueue_bench.py

    run = common.run

    def labelled(peer: str, *args: object, **kwargs: object) -> object:
        return run(f"{peer}[{label}]", *args, **kwargs)

    common.run = labelled
    runpy.run_path(sys.argv[0], run_name="__main__")
