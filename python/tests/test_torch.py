"""gradsnap.torch through a real gradsnap-server: torch.distributed.checkpoint saves and loads
with 1 and 2 processes (Gloo), loads with another world size, async_save, exactness, a save
killed before its metadata is durable, a flipped byte. Run by ctest (label torch) with the
shared venv's python (scripts/torch-venv.sh); each rank is a dcp_worker.py process."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import gradsnap
import gsutil

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dcp_worker.py")


def start_ranks(world, args):
    port = gsutil.free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, WORKER, *map(str, args)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def run_ranks(world, args, timeout=240):
    """Runs `world` ranks of dcp_worker.py to the end: [(exit code, stdout, stderr)]."""
    out = []
    for p in start_ranks(world, args):
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        out.append((p.returncode, o, e))
    return out


class DcpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gradsnap-dcp-")
        cls.data = os.path.join(cls.tmp, "data")
        cls.server = gsutil.Server(cls.data)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def client(self):
        return gradsnap.connect(servers=self.server.address)

    def ok(self, world, *ops, server=None):
        """Runs `world` ranks through the saves and loads `ops` (dcp_worker.py's OPs, in one
        process start) against `server` (dcp_worker.py's SERVER; default this class's
        server); every load must be exact."""
        args = [server or self.server.address]
        for op in ops:
            args += (["+"] if len(args) > 1 else []) + [str(x) for x in op]
        for rank, (rc, out, err) in enumerate(run_ranks(world, args)):
            self.assertEqual(rc, 0, f"rank {rank} of {args}: {out}\n{err[-3000:]}")
            loads = sum(1 for op in ops if op[0] == "load")
            self.assertEqual(out.count(": exact"), loads, out)

    def steps(self, job):
        with self.client() as c:
            return [i["step"] for i in c.list(job)]

    def test_one_process_saves_two_load(self):
        self.ok(1, ["save", "one", 10], ["load", "one", "latest", 10])
        self.assertEqual(self.steps("one"), [10])
        with self.client() as c:
            info = c.show("one", 10)
        self.assertEqual(info["world_size"], 2)  # the rank's shard and DCP's metadata
        # Each of 2 ranks needs about half of the one shard: read as one stream (fraction 0;
        # pieces of stored tensors cut out of it) and with ranged reads (fraction 2).
        self.ok(2, ["load", "one", 10, 10], ["load", "one", 10, 10, "--stream-fraction", 0],
                ["load", "one", 10, 10, "--stream-fraction", 2])

    def test_two_processes_async_save_load_with_one_and_two(self):
        self.ok(2, ["save", "two", 20, "--async"], ["save", "two", 30], ["load", "two", 20, 20])
        self.assertEqual(self.steps("two"), [20, 30])
        self.ok(1, ["load", "two", "latest", 30])

    def test_save_killed_before_commit_leaves_nothing_listed(self):
        addr = self.server.address
        self.ok(2, ["save", "kill", 1])
        procs = start_ranks(2, [addr, "save", "kill", 2, "--pause-in-finish"])
        try:
            # Rank 0 (DCP's coordinator) prints "finishing" once both ranks' shards are durable.
            line = ""
            while "finishing" not in line:
                line = procs[0].stdout.readline()
                if not line:
                    self.fail(f"rank 0 ended: {procs[0].communicate()}")
            with self.client() as c:
                pending = [(i["step"], i["state"]) for i in c.list("kill", pending=True)]
            self.assertIn((2, "pending"), pending)
        finally:
            for p in procs:
                p.send_signal(signal.SIGKILL)
            for p in procs:
                p.communicate()
        self.assertEqual(self.steps("kill"), [1])
        self.ok(1, ["load", "kill", "latest", 1])
        # Saving step 2 again, from other values (seed 7), replaces every stale shard.
        self.ok(2, ["save", "kill", 2, "--seed", 7], ["load", "kill", "latest", 7])

    def test_cluster_mode_through_etcd(self):
        # connect(etcd=...): a real etcd member, two servers registered in it, every shard on
        # both; "latest" is resolved although cluster listings carry no checkpoint metadata.
        with gsutil.Cluster(self.tmp, nodes=2) as cl:
            self.ok(2, ["save", "cl", 3], ["save", "cl", 4], ["load", "cl", "latest", 4],
                    server=f"etcd={cl.etcd.endpoint}")

    def test_flipped_byte_is_an_error(self):
        self.ok(1, ["save", "flip", 5])
        self.server.stop()
        try:
            self.assertGreater(gsutil.flip_segment_bytes(self.data, "flip", 5), 0)
        finally:
            type(self).server = gsutil.Server(self.data)
        [(rc, out, err)] = run_ranks(1, [self.server.address, "load", "flip", 5, 5])
        self.assertNotEqual(rc, 0, out)
        self.assertNotIn("exact", out)
        self.assertIn("DataLoss", err)


if __name__ == "__main__":
    unittest.main()
