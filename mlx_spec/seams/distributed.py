"""Speculation over a target sharded across processes with MLX's distributed backend (`mlx.launch`).

Every rank holds a slice of the target (mlx-lm's tensor or pipeline sharding: its forward passes exchange
activations among the ranks) and a whole drafter, and runs the same engine on the same inputs with the same seeds,
so every rank drafts, verifies and accepts the same tokens without sending drafts around. Rank 0 (the leader) runs
the command; the others (followers) run each generation and batch it starts. These keep them in step:
- `share`: the leader hands each generation (the engine it runs on, its prompt ids, settings, the draft-length
  policy's state and its drafter's estimates of its drafts) to every follower before it starts;
- the prompt cache: announced with each generation (which of rank 0's, its budget: `mirror_cache`), it holds the
  same sequences on every rank, each rank its slice: each cache is cut back to a shared start only where every
  rank's can be (`agree_cache`, at each start), and each stored sequence counts the bytes of the rank where it
  takes most (`largest`, as it is stored), so every rank serves and evicts alike;
- `agree`, once a round: every rank contributes a checksum of the tokens it accepted, and takes the leader's round
  time (the policy learns the same costs everywhere, so it picks the same draft lengths), its stop request and
  a draft length pinned meanwhile; a checksum that differs stops every rank with an error (ranks on different
  hardware computing different floats);
- a batch (`begin_batch`, `in_step`): the leader announces it with its policies' state, then hands every rank
  each job as it joins and, once a round, every row's stop and draft-length pin in one collective, so rows
  join, leave and take a pin at the same round on every rank (the round's checksum as above);
- `finish`: the leader's last message, after which the followers exit.
A rank that dies breaks the others' next collective ("connection lost"): `lost` turns that into a one-line error.
MLX's ring backend can also leave a survivor waiting forever instead (a socket's I/O thread that gave up takes no
further sends or receives, and the next collective waits on it), so on the ring backend each rank also holds a
plain TCP connection to each neighbour that carries nothing (`watch_neighbours`): a neighbour's process that ends
closes it, and a rank still running `GRACE_SECONDS` later (not `done`, no `lost` error reported) reports the
break itself and exits with status 2.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import threading
import time
import zlib
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .caches import trimmable
from .errors import SpecError

MODES = ("tensor", "pipeline")
LAUNCH_HINT = "start every rank with mlx.launch, e.g. `mlx.launch -n 2 --backend ring -- mlx-spec generate ...`"


def join(mode: str) -> mx.distributed.Group:
    """This process's group for `--distributed MODE`; fails unless it was started as one of several ranks."""
    if mode not in MODES:
        raise SpecError(f"--distributed must be one of {', '.join(MODES)}, got {mode!r}")
    try:
        group = mx.distributed.init(strict=True)
    except RuntimeError as e:
        raise SpecError(f"--distributed {mode}: no distributed backend answered ({first_line(e)}): {LAUNCH_HINT}")
    if group.size() < 2:
        raise SpecError(f"--distributed {mode} needs two or more processes, this one runs alone: {LAUNCH_HINT}")
    return group


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


GRACE_SECONDS = 3.0  # a survivor's own failed collective normally ends it (with `lost`) well within this
REPORTED = threading.Event()  # this process told its user that the group broke


def broke(rank: int, why: str) -> SpecError:
    return SpecError(f"rank {rank}: the distributed group broke ({why}): another rank stopped or lost its "
                     "connection; see its output")


def lost(error: BaseException) -> SpecError | None:
    """The one-line error for a collective that failed because another rank went away (None: not that)."""
    text = str(error)
    if isinstance(error, RuntimeError) and any(text.startswith(f"[{b}]") for b in ("ring", "mpi", "jaccl", "nccl")):
        REPORTED.set()
        return broke(mx.distributed.init().rank() if mx.distributed.is_available() else 0, first_line(error))
    return None


def ring_hosts() -> list[str] | None:
    """Each rank's first address in the ring backend's hostfile (`MLX_HOSTFILE`, as mlx.launch writes it);
    None when there is none (another backend)."""
    try:
        with open(os.environ["MLX_HOSTFILE"]) as f:
            return [str(addresses[0]).rsplit(":", 1)[0] for addresses in json.load(f)]
    except (KeyError, OSError, ValueError, TypeError, IndexError):
        return None


def watch_neighbours(lockstep: Lockstep, hosts: list[str], timeout: float = 60.0) -> list[socket.socket]:
    """Connect this rank to the next one and accept the previous one's connection, on each rank's address in the
    ring's hostfile (the links the ring itself uses) and a port each rank picks, and watch both connections
    from daemon threads (see the module docstring). Returns them (open as long as this process runs); none,
    with a warning, if they cannot be made."""
    rank, size = lockstep.rank, lockstep.size
    right, left = (rank + 1) % size, (rank - 1) % size
    problem, links = None, []
    try:
        server = socket.create_server((hosts[rank], 0))
    except OSError as e:
        server, problem = None, e
    ports = mx.distributed.all_gather(mx.array([server.getsockname()[1] if server else 0]), group=lockstep.group,
                                      stream=mx.cpu)
    ports = np.array(ports).tolist()
    if server:
        with server:
            try:
                if ports[right] == 0:
                    raise OSError(f"rank {right} could not listen")
                links.append(socket.create_connection((hosts[right], ports[right]), timeout=timeout))
                server.settimeout(timeout)
                links.append(server.accept()[0])
            except OSError as e:
                problem = e
    if problem:
        print(f"mlx-spec: warning: rank {rank} cannot watch its neighbours ({problem}): if one dies, this rank "
              "may wait for it forever", file=sys.stderr)
        for link in links:
            link.close()
        return []
    for link, peer in zip(links, (right, left)):
        link.settimeout(None)
        threading.Thread(target=watch, args=(lockstep, link, peer), daemon=True).start()
    return links


def watch(lockstep: Lockstep, link: socket.socket, peer: int) -> None:
    """Wait for `peer`'s process to end (its end of `link` closes: nothing is ever sent on it), then give this
    rank `GRACE_SECONDS` to end on its own before it reports the break and exits."""
    try:
        link.recv(1)
    except OSError:
        pass
    time.sleep(GRACE_SECONDS)
    if not lockstep.done:
        if not REPORTED.is_set():
            print(f"mlx-spec: error: {broke(lockstep.rank, f'rank {peer} ended')}", file=sys.stderr, flush=True)
        os._exit(2)


@dataclass
class Generation:
    """What a follower needs to run the leader's next generation exactly as the leader does."""

    engine: int  # which of the leader's engines (0: the loaded one; others: `with_drafter` siblings, in order made)
    drafter: str  # that engine's drafter, to make the follower's sibling the first time
    policy: object  # the engine's draft-length policy as it stands (learnt costs and acceptance included)
    estimates: object  # what its drafter learnt of its drafts (n-gram's outlook; None: nothing), as it stands
    job: object  # the generation's Job as it crosses (`Job.portable`)
    cache: tuple[int, int] | None = None  # the engine's prompt cache: (which of the leader's, its budget); None: none


@dataclass
class Batch:
    """What a follower needs to run the leader's next batch exactly as the leader does (its jobs and stops come
    round by round: `in_step`)."""

    engine: int  # as `Generation`'s
    drafter: str
    draft_len: int | None  # the batch's pinned draft length (None: adaptive)
    policies: tuple  # the batch decoder's draft-length policies (a batch's, a lone row's) as they stand
    estimates: object
    batch_size: int
    cache: tuple[int, int] | None = None  # as `Generation`'s


class Lockstep:
    """The ranks of one sharded engine (and its siblings) acting as one; see the module docstring."""

    def __init__(self, group: mx.distributed.Group):
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.engines: list = []  # the leader's engines, by the index generations name them with
        self.running = False  # a generation is under way (from its announcement on): no other collective may start
        self.policy = None  # the draft-length policy the followers last received
        self.announced: Batch | None = None  # a follower's: the batch it runs
        self.caches: list = []  # the prompt caches of the leader's engines, by the index announcements name them with
        self.done = False  # this rank ended its part normally: a neighbour ending now is no break
        hosts = ring_hosts()
        self.links = watch_neighbours(self, hosts) if hosts and len(hosts) == self.size else []

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def _sum(self, values: np.ndarray) -> np.ndarray:
        out = mx.distributed.all_sum(mx.array(values), group=self.group, stream=mx.cpu)
        mx.eval(out)
        return np.array(out)

    def share(self, obj: object = None) -> object:
        """The leader's `obj` on every rank (the followers' argument is ignored)."""
        data = np.frombuffer(pickle.dumps(obj), np.uint8) if self.leader else np.zeros(0, np.uint8)
        length = int(self._sum(np.array([data.size], np.int32))[0])
        payload = data if self.leader else np.zeros(length, np.uint8)
        return pickle.loads(self._sum(payload).tobytes())

    def _decide(self, value: int) -> int:
        """The leader's whole number `value` on every rank (the followers' is ignored), in one collective."""
        return int(self._sum(np.array([value if self.leader else 0], np.int32))[0])

    def _announce(self, engine, make) -> None:
        """The leader sends `make(index of engine, its drafter's estimates, its prompt cache)` to the followers;
        then every rank's engine takes the view of its cache that all ranks share (`agree_cache`)."""
        self.running = True  # before the announcement: if it fails, the group is lost and `finish` must not wait
        if self.leader:
            if engine not in self.engines:
                self.engines.append(engine)
            self.share(make(self.engines.index(engine), engine.drafter.estimates() if engine.drafter else None,
                            self._cache_of(engine.prompt_cache)))
        self.agree_cache(engine)

    def _cache_of(self, cache) -> tuple[int, int] | None:
        """The leader's prompt cache `cache` as announcements name it: (its index, its budget); None: none."""
        if cache is None:
            return None
        if not any(known is cache for known in self.caches):
            cache.agree = self.largest
            self.caches.append(cache)
        return next(i for i, known in enumerate(self.caches) if known is cache), cache.budget

    def mirror_cache(self, engine, cache: tuple[int, int] | None) -> None:
        """A follower's `engine` takes the prompt cache the leader's announced (`_cache_of`): one of the same
        budget, shared by the same engines."""
        if cache is not None and cache[0] == len(self.caches):
            engine.cache_prompts(cache[1])
            engine.prompt_cache.agree = self.largest
            self.caches.append(engine.prompt_cache)
        engine.prompt_cache = None if cache is None else self.caches[cache[0]]

    def agree_cache(self, engine) -> None:
        """Every rank's target can be cut back to a prefix only where every rank's can (`Target.ranks_trim`): in
        pipeline mode a rank holding only attention layers could, one holding recurrent layers could not."""
        mine = np.array([trimmable(engine.target.cache)], np.int32)
        engine.target.ranks_trim = bool(self._sum(mine)[0] == self.size)

    def largest(self, value: int) -> int:
        """The largest of every rank's whole number `value` (bytes), on every rank."""
        every = mx.distributed.all_gather(mx.array([value], dtype=mx.int64), group=self.group, stream=mx.cpu)
        mx.eval(every)
        return int(np.array(every).max())

    def begin(self, engine, job) -> None:
        """Called by `Engine.decode` as a generation of `job` starts: the leader sends it to the followers."""
        policy = engine.next_policy  # read once: a pin may land at any time
        self._announce(engine, lambda index, estimates, cache: Generation(
            index, engine.status().drafter, policy, estimates, job.portable(), cache))
        self.policy = policy

    def begin_batch(self, engine, decoder, batch_size: int, draft_len: int | None) -> None:
        """Called by `Engine` as a batch (`decoder`'s) starts, on every rank: the leader sends it to the followers,
        whose decoder takes the leader's policies."""
        self._announce(engine, lambda index, estimates, cache: Batch(
            index, engine.status().drafter, draft_len, (decoder.policy, decoder.alone), estimates, batch_size,
            cache))
        if not self.leader:
            decoder.policy, decoder.alone = self.announced.policies

    def in_step(self, take, stops, rebuilt):
        """A batch's `take`, `stops` (keys -> whether each stops) and round agreement (`RoundLoop.agree`) that
        every rank calls in the same order: each answers with the leader's, in one collective (two for a job
        taken). A job runs as a copy, crossed (`Job.portable`) and `rebuilt` on every rank, whose draft length a pin
        changes between rounds only, on every rank at once (the leader reads the caller's job as it shares its
        stops)."""
        jobs = {}  # key -> (the job as the caller holds it, the copy the decoder runs)

        def shared_take():
            item = take() if self.leader else None
            if not self._decide(item is not None):
                return None
            job = rebuilt(self.share(item[1].portable() if self.leader else None))
            key = item[0] if self.leader else len(jobs)
            jobs[key] = (item[1] if self.leader else job, job)  # `job` is a copy on every rank (unpickled)
            return key, jobs[key][1]

        def shared_stops(keys: list) -> list[bool]:
            mine = np.zeros(len(keys), np.int32)
            if self.leader:  # each: its stop, and its pin (0: none, else the length + 1) above it
                pins = [jobs[key][0].draft_len for key in keys]
                mine += np.array(stops(keys), np.int32) + 2 * np.array([0 if p is None else p + 1 for p in pins])
            values = self._sum(mine).tolist()
            for key, value in zip(keys, values):
                jobs[key][1].draft_len = value // 2 - 1 if value // 2 else None
            return [bool(value % 2) for value in values]

        def agree(new_tokens: list[list[int]], seconds: float | None) -> float | None:
            return self._check(np.concatenate([np.asarray(t, np.int64) for t in new_tokens]), seconds, False)[0][0]

        return shared_take, shared_stops, agree

    def agree(self, engine, tokens: list[int], seconds: float, stop: bool) -> tuple[float, bool]:
        """Once a round, after `engine` accepted `tokens` in `seconds`: check that every rank accepted the same.
        Returns rank 0's round seconds (for the policy to learn) and stop request; rank 0's draft-length policy,
        if another thread pinned a new one meanwhile, becomes every rank's `policy` from the next round on."""
        pinned = engine.next_policy if self.leader else None  # read once: a pin may land at any time
        (seconds, stop), repinned = self._check(np.asarray(tokens, np.int64), seconds, stop,
                                                self.leader and pinned is not self.policy)
        if repinned:  # rank 0 was pinned this round: its new policy, on every rank from the next round on
            shared = self.share(pinned)
            self.policy = pinned if self.leader else shared
            if not self.leader:
                engine.next_policy = shared
        return seconds, stop

    def _check(self, tokens: np.ndarray, seconds: float | None, stop: bool,
               repinned: bool = False) -> tuple[tuple[float | None, bool], bool]:
        """Every rank's checksum of the round's `tokens` against rank 0's (a SpecError where one differs);
        returns rank 0's (round seconds, stop) and whether it was pinned."""
        checksum = zlib.crc32(tokens.tobytes()) & 0x7FFFFFFF
        micros = -1 if seconds is None else min(int(seconds * 1e6), 2**31 - 1)
        mine = mx.array([checksum, micros, int(stop), int(repinned)], dtype=mx.int32)
        every = mx.distributed.all_gather(mine, group=self.group, stream=mx.cpu)
        mx.eval(every)
        every = np.array(every).reshape(self.size, 4)
        if (every[:, 0] != every[0, 0]).any():
            ranks = ", ".join(str(r) for r in np.flatnonzero(every[:, 0] != every[0, 0]))
            raise SpecError(f"rank {ranks} accepted other tokens than rank 0 this round: the ranks' forward passes "
                            "disagree (different hardware, MLX versions or checkpoint files?); every rank stops")
        return (None if every[0, 1] < 0 else every[0, 1] / 1e6, bool(every[0, 2])), bool(every[0, 3])

    def end(self) -> None:
        """Called as a generation or batch ends, on every rank."""
        self.running = False

    def follow(self, engine) -> int:
        """A follower's whole job: run each generation the leader shares until it finishes; returns 0."""
        engines = [engine]
        while (job := self.share()) is not None:
            while len(engines) <= job.engine:
                engines.append(engine.with_drafter(job.drafter))
            follower = engines[job.engine]
            self.mirror_cache(follower, job.cache)
            if job.estimates is not None:  # each rank's profile may hold others: every rank drafts the leader's way
                follower.drafter.start_from(job.estimates)
            if isinstance(job, Batch):
                self.announced = job
                follower.follow_batch(job.batch_size, job.draft_len)
                continue
            follower.next_policy = job.policy
            for _ in follower.decode(job.job.rebuilt(follower.tokenizer)):
                pass
        self.done = True
        return 0

    def finish(self) -> None:
        """The leader's last word: the followers leave `follow`. Skipped after a generation broke off, its
        announcement included: the followers are inside its collectives (the leader's exit ends them with `lost`),
        or the group is lost, and a collective after a failed one never returns. A rank that died since the last
        generation fails this one instead: that was reported, there is no one left to tell."""
        if self.leader and not self.running:
            self.done = True
            try:
                self.share(None)
            except RuntimeError:  # MLX's "[ring] connection to a peer was lost"
                pass
