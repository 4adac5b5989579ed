"""A Ray cluster of several nodes on this machine, on the loopback interface only, for the tests of the Ray launcher
(tests/test_scale_ray.py): ``python tests/ray_cluster.py --nodes 2 --cpus 1``.

Each node is its own set of processes (the head: GCS and raylet; every node: a raylet, its workers and agents),
started through Ray's documented helper for multi-node clusters on one machine (``ray.cluster_utils.Cluster``).
``ray start --address=127.0.0.1:<port>`` cannot be used for the second node: it replaces 127.0.0.1 by the machine's
outward address (and refuses to start at all when ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps Ray on the
loopback interface). Prints one JSON line (``address``, and per node its ``node_id``, ``head``, ``raylet_pid`` and
``pids``) once every node is up, then reads its standard input: each line ``add`` starts one more node of the same
CPUs and prints that node's JSON line once it is up (the tests add a node of their own to a shared cluster, to lose
it); when the input closes it stops every node and exits.
"""

import argparse
import json
import os
import sys

# before Ray is imported: every node on 127.0.0.1, nothing reported to Ray's usage statistics
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=1, help="CPUs of each node")
    args = parser.parse_args()

    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    node_args = {"num_cpus": args.cpus, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=node_args)
    try:
        for _ in range(args.nodes - 1):
            cluster.add_node(**node_args)
        cluster.wait_for_nodes()

        def describe(node) -> dict:
            pids = [info.process.pid for infos in node.all_processes.values() for info in infos]
            raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
            return {"node_id": node.node_id, "head": node is cluster.head_node, "raylet_pid": raylet, "pids": pids}

        nodes = [describe(node) for node in [cluster.head_node, *cluster.worker_nodes]]
        print(json.dumps({"address": cluster.address, "nodes": nodes}), flush=True)
        for line in sys.stdin:  # until the test closes the pipe (Ray's nodes handle SIGTERM themselves)
            if line.strip() == "add":
                print(json.dumps(describe(cluster.add_node(**node_args))), flush=True)
            elif line.strip():
                print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
