"""One step's replay (``xsp.analysis.replay``, step 3) and its critical path (step 4).

The host issues its spans in order; a launch enqueues its activity; each lane (a device's
stream) runs its activities in order (``_Queue``); a sync, or a thread's wait for its
collectives, blocks the host until the awaited work has ended and moves what follows by that
wait (``Iteration._host_events``); the host's spans and the step's end are then placed
(``Iteration._place``)."""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from xsp.analysis.replay.collectives import CollectiveWait
from xsp.analysis.replay.edits import Timing
from xsp.analysis.replay.graph import Graph
from xsp.core.intervals import find_rows, order_by, stab

__all__ = ["Iteration"]


class _Queue:
    """Step 3's GPU side: the step's activities in launch order. Between two events (a sync,
    which moves what follows by its wait, and a stream's wait on an event, which holds its
    stream's next work) each lane runs its activities as a recurrence, end = max(ready,
    previous end + gap) + duration, solved for the whole stretch at once with a running maximum
    (the replay took 5 ms a ResNet-50 step one activity at a time)."""

    def __init__(self, it: Iteration, launch_at_step_start: bool) -> None:
        g, ws, wd = it.graph, it.ws, it.wd
        acts = it.activities
        launcher = g.parent[acts]
        # an activity is launched at its launch call's end; a blocking copy's at the call's
        # start, and one whose parent is an op (a level set without L) at the op's start
        at_end = g.is_call[launcher] & ~g.is_sync[launcher]
        launch = np.where(at_end, ws[launcher] + wd[launcher], ws[launcher]).astype(np.int64)
        if launch_at_step_start:
            launch = np.full(len(acts), it.step_start, dtype=np.int64)
        order = np.argsort(launch, kind="stable")
        self.rows, self.launch, self.launcher = acts[order], launch[order], launcher[order]
        self.n = n = len(acts)
        self.by_sync = g.is_sync[self.launcher]
        self._lanes(it)
        self._nccl(it)
        self.act_launch = np.zeros(n, dtype=np.int64)
        self.act_start = np.zeros(n, dtype=np.int64)
        self.act_end = np.zeros(n, dtype=np.int64)
        # the one before on its stream, where it (not the launch) held the activity back
        self.act_prev = np.full(n, -1, dtype=np.int64)
        self.lane_last = dict.fromkeys(self.lanes, -1)  # each lane's last replayed activity
        self.held_by: dict[int, int] = {}  # stream -> the activity its next work waits for
        self.delta = 0  # what the host's waits so far moved the launches by
        self.done = 0  # activities replayed so far
        self._events(it)

    def _lanes(self, it: Iteration) -> None:
        """Each lane's and each stream's activities, and their device delays."""
        act_stream = it.graph.stream[self.rows]
        lane_of = it.graph.lane[self.rows]
        self.lanes: list[int] = np.unique(lane_of).tolist()
        self.lane_rows = {k: np.nonzero(lane_of == k)[0] for k in self.lanes}
        self.lane_stream = {k: int(act_stream[rows[0]]) for k, rows in self.lane_rows.items()}
        self.streams = set(act_stream.tolist())
        self.stream_rows = {s: np.nonzero(act_stream == s)[0] for s in self.streams}
        self.latency = it.timing.latency[self.rows]
        self.gap = it.timing.gap[self.rows]

    def _nccl(self, it: Iteration) -> None:
        """NCCL's kernels: each starts spinning when launched and free, and ends once the last
        rank's has started, plus its transfer (as measured, waits included, in the first
        round)."""
        coll = it.graph.collectives
        on_gpu = it.work_index[coll.on_gpu[it.work_index]]
        self.kernel_at = find_rows(self.rows, coll.work[on_gpu])
        self.arrive = np.full(self.n, -1, dtype=np.int64)
        self.measured = it.timing.gpu_dur[self.rows]
        if it.arrivals is not None and len(on_gpu):
            self.measured = self.measured.copy()
            self.measured[self.kernel_at] = coll.transfer_ns[on_gpu]
            self.arrive[self.kernel_at] = it.arrivals[on_gpu]

    def _events(self, it: Iteration) -> None:
        """The step's event records and its streams' waits on events, in host order."""
        host, named, ws = it.host, it.graph.named, it.ws
        self.named, self.ws = named, ws
        rows = host[named.is_record[host] & (named.event[host] >= 0)]
        self.records = list(
            zip(
                named.event[rows].tolist(),
                ws[rows].tolist(),
                named.stream[rows].tolist(),
                strict=True,
            )
        )
        rows = host[named.is_wait[host] & (named.event[host] >= 0) & (named.stream[host] >= 0)]
        self.waits = list(
            zip(
                ws[rows].tolist(),
                named.event[rows].tolist(),
                named.stream[rows].tolist(),
                strict=True,
            )
        )
        # the activity before which each wait takes effect: the first launched after it
        self.wait_at: list[int] = np.searchsorted(self.launch, ws[rows], side="right").tolist()
        self.next_wait = 0

    def before_record(self, event: int, at: int) -> int | None:
        """The last activity queued on ``event``'s stream before its last record before ``at``
        (-1: none), or None when this step recorded the event on no stream."""
        record = next((r for r in reversed(self.records) if r[0] == event and r[1] < at), None)
        if record is None or record[2] < 0:
            return None
        queued = self.stream_rows.get(record[2], self.rows[:0])
        bound = min(self.done, int(np.searchsorted(self.launch, record[1], side="right")))
        last = int(np.searchsorted(queued, bound)) - 1
        return int(queued[last]) if last >= 0 else -1

    def stretch(self, lo: int, hi: int) -> None:
        """Replay activities lo..hi-1: no sync or wait among them, so ``delta`` and ``held_by``
        hold, and each lane's activities form one recurrence."""
        act_end = self.act_end
        for lane in self.lanes:
            mine = self.lane_rows[lane]
            mine = mine[(mine >= lo) & (mine < hi)]
            if not len(mine):
                continue
            at = self.launch[mine] + self.delta
            ready = at + self.latency[mine]
            held = self.held_by.get(self.lane_stream[lane], -1)
            held_end = int(act_end[held]) if held >= 0 else -1
            prev = self.lane_last[lane]
            waiting = np.maximum(np.maximum(ready, held_end), -1)
            floor = np.maximum(waiting, self.arrive[mine])  # an NCCL kernel: the last arrival
            dur, step = self.measured[mine], self.gap[mine] + self.measured[mine]
            total = np.cumsum(step)
            # end_k = total_k + max(the previous end, max over j <= k of floor_j + dur_j
            # - total_j): the latest start that held each activity, carried forward
            reach = np.maximum.accumulate(floor + dur - total)
            if prev >= 0:
                reach = np.maximum(reach, int(act_end[prev]))
            end = total + reach
            begin = end - dur
            before = np.concatenate(([prev], mine[:-1]))
            before_end = np.concatenate(([act_end[prev] if prev >= 0 else 0], end[:-1]))
            queued = np.where(before >= 0, before_end + self.gap[mine], -1)
            # an NCCL kernel is drawn from when it began to spin
            begin = np.where(self.arrive[mine] >= 0, np.maximum(waiting, queued), begin)
            self.act_launch[mine] = at
            self.act_start[mine] = begin
            act_end[mine] = end
            self.act_prev[mine] = np.where(
                held_end > np.maximum(ready, queued),
                held,  # another stream's work held it: an edge
                np.where(queued >= ready, before, -1),
            )
            self.lane_last[lane] = int(mine[-1])

    def replay_until(self, limit: float) -> None:
        """Replay the activities launched before ``limit`` (at it: a blocking copy's)."""
        n, launch = self.n, self.launch
        stop = int(np.searchsorted(launch, limit, side="left")) if limit < np.inf else n
        while stop < n and launch[stop] == limit and self.by_sync[stop]:
            stop += 1
        waits, wait_at = self.waits, self.wait_at
        while self.done < stop:
            while self.next_wait < len(waits) and wait_at[self.next_wait] <= self.done:
                at, event, waiting = waits[self.next_wait]
                self.next_wait += 1
                awaited = self.before_record(event, at)
                held = self.held_by.get(waiting, -1)
                if (
                    awaited is not None
                    and awaited >= 0
                    and (held < 0 or self.act_end[awaited] > self.act_end[held])
                ):
                    self.held_by[waiting] = awaited
            upto = min(stop, wait_at[self.next_wait]) if self.next_wait < len(waits) else stop
            self.stretch(self.done, upto)
            self.done = upto

    def awaited_by(self, sync: int) -> np.ndarray:
        """The replayed activities ``sync`` waits for: the work before its event's record, its
        stream's, or (naming neither, or a stream this step never used) every one."""
        named = self.named
        if named.event[sync] >= 0:
            awaited = self.before_record(int(named.event[sync]), int(self.ws[sync]))
            if awaited is not None:
                return np.array([awaited] if awaited >= 0 else [], dtype=np.int64)
        if named.stream[sync] >= 0 and int(named.stream[sync]) in self.streams:
            mine = self.stream_rows[int(named.stream[sync])]
            return mine[mine < self.done]
        return np.arange(self.done)


class Iteration:
    """One step's replay (step 3, ``run``: its activities a stretch at a time) and its critical
    path (step 4, ``critical_path``: a walk back from the step's end)."""

    def __init__(
        self, graph: Graph, timing: Timing, position: int, arrivals: np.ndarray | None
    ) -> None:
        self.graph, self.timing = graph, timing
        step = self.step = int(graph.steps[position])
        members = graph.members[position]
        self.ws, self.wd = timing.warped_start, timing.warped_dur
        host = members[~graph.gpu[members] & (members != step)]
        self.host = host[order_by(self.ws[host], -self.wd[host])]
        self.activities = members[graph.gpu[members]]
        self.step_start = int(graph.start[step])
        self.collectives = graph.collectives
        self.work_index = (
            np.nonzero(np.isin(graph.collectives.work, members))[0]
            if len(graph.collectives.work)
            else np.zeros(0, np.int64)
        )
        # where the step's marker ends on the host timeline: a range may outlast it (the
        # optimizer's, by the tracer's own boundary work; gloo's all-reduce, recorded up to
        # 1.8 ms past its step on the dev machine), and M's step ends at its marker too
        self.marker_end = int(self.ws[step] + self.wd[step])
        self.arrivals = arrivals  # each work's last arrival across ranks (None: as measured)

    # -- step 3 --------------------------------------------------------------------------------
    def run(self) -> None:
        """Step 3: the activities replayed a stretch at a time between the host's events, then
        the host's spans and the step's end placed."""
        queue = _Queue(self, self.timing.launch_at_step_start)
        self.act_rows, self.act_launcher, self.kernel_at = (
            queue.rows,
            queue.launcher,
            queue.kernel_at,
        )
        self.act_launch, self.act_start = queue.act_launch, queue.act_start
        self.act_end, self.act_prev = queue.act_end, queue.act_prev
        self._host_events(queue)
        self._place(len(queue.rows))

    def _host_events(self, queue: _Queue) -> None:
        """The host's events in order, the GPU replayed up to each: a sync waits for the work
        it names, a thread for its collectives; each moves what follows by its wait."""
        ws, host = self.ws, self.host
        sync_rows = host[self.graph.is_sync[host]]
        syncs = sync_rows.tolist()
        thread_waits = self.collectives.waits.get(self.step, [])
        gap_at = [
            int(ws[w.after] + self.wd[w.after]) if w.after >= 0 else int(ws[self.step])
            for w in thread_waits
        ]
        events = sorted(
            [(at, 0, sync) for sync, at in zip(syncs, ws[sync_rows].tolist(), strict=True)]
            + [(at, 1, k) for k, at in enumerate(gap_at)]
        )
        self.sync_wait: dict[int, tuple[int, int]] = {}  # sync row -> (awaited act, its end)
        self.waited_on_collectives: list[tuple[int, int, int]] = []  # (from, to, work row)
        event_starts: list[int] = []
        moved: list[int] = []  # the cumulative delay after each event
        delays: list[int] = []  # each event's added wait, in warped order
        for at, is_collective, which in events:
            queue.replay_until(at)
            real = at + queue.delta
            if is_collective:  # a thread's wait for its collectives (the gap before resume)
                change = self._collective_wait(thread_waits[which], at, real, event_starts, moved)
            else:
                change = self._sync_wait(queue, which, real)
            delays.append(change)
            queue.delta += change
            event_starts.append(at)
            moved.append(queue.delta)
        queue.replay_until(np.inf)
        self.sync_rows = syncs
        self.sync_starts = np.asarray(event_starts, dtype=np.int64)
        self.sync_delays = np.cumsum(delays, dtype=np.int64) if delays else np.zeros(0, np.int64)

    def _sync_wait(self, queue: _Queue, sync: int, real: int) -> int:
        """What ``sync`` (reached at ``real``) adds to the host: its wait for the work it names,
        against the length it has on the host timeline (which holds the F run's own wait)."""
        ready = real
        awaited = queue.awaited_by(sync) if queue.done else queue.rows[:0]
        if len(awaited):
            last = int(awaited[np.argmax(self.act_end[awaited])])  # the first of equal ends
            finish = int(self.act_end[last])
            if finish > real:
                ready = finish
                self.sync_wait[sync] = (last, finish)
        return (ready - real) + int(self.graph.base[sync]) - int(self.wd[sync])

    def _collective_wait(
        self, wait: CollectiveWait, at: int, real: int, event_starts: list[int], moved: list[int]
    ) -> int:
        """What a thread's wait for its collectives (the gap before it resumed, reached at
        ``real``) adds to the host: the wait until the last of them ended, and its waking up,
        against the gap it has on the host timeline. The critical path charges it to the
        collective."""
        finish, last = max(
            (self._work_end(int(i), event_starts, moved), int(i)) for i in wait.works
        )
        ready = max(real, finish)
        if ready > real:
            self.waited_on_collectives.append((real, ready, int(self.collectives.work[last])))
        length = max(0, int(self.ws[wait.resume]) - at)
        return (ready - real) + wait.wake_ns - length

    def _work_end(self, index: int, event_starts: list[int], moved: list[int]) -> int:
        """A collective's replayed end on this rank: its last arrival (or its own start, if
        later) and its transfer; its start moved by the host's events before it."""
        coll = self.collectives
        begin = int(self.ws[int(coll.work[index])])
        before = bisect_left(event_starts, begin)
        begin += moved[before - 1] if before else 0
        last = (
            begin + int(coll.wait_ns[index]) if self.arrivals is None else int(self.arrivals[index])
        )
        return max(last, begin) + int(coll.transfer_ns[index])

    def _place(self, n: int) -> None:
        """The host's spans moved by the waits before them, the collectives' work ending after
        the last rank's arrival, and the step's end; every row drawn inside its step."""
        host, ws, wd = self.host, self.ws, self.wd
        # host spans move by the waits of the syncs that began before them
        begin = self._shift(ws[host], inclusive=False)
        end = self._shift(ws[host] + wd[host], inclusive=False)
        self._place_collectives(end)
        marker_end = int(self._shift(np.array([self.marker_end]), inclusive=False)[0])
        marker_end = max(marker_end, self.step_start)
        host_end = min(int(end.max()), marker_end) if len(host) else self.step_start
        gpu_end = int(self.act_end.max()) if n else self.step_start
        self.host_end = host_end
        self.tail = marker_end - host_end  # the marker's own sync and return, after the host
        self.gpu_end = gpu_end
        self.step_end = max(marker_end, gpu_end)
        # drawn inside its step, a span that lasted in its last nanosecond at least (a host
        # whose F cost took it all can place spans past the step's end)
        lasted = end > begin
        begin = np.minimum(begin, self.step_end - lasted)
        end = np.clip(end, begin + lasted, self.step_end)
        # every row of the step, replayed: its host spans, its activities and the step itself
        self.rows = np.concatenate((host, self.act_rows, [self.step]))
        self.start = np.concatenate((begin, self.act_start, [self.step_start]))
        self.dur = np.concatenate(
            (end - begin, self.act_end - self.act_start, [self.step_end - self.step_start])
        )
        self.host_begin, self.host_finish = begin, end

    def _place_collectives(self, end: np.ndarray) -> None:
        """A collective's work ends once the last rank has arrived, plus its transfer (``end``,
        the host spans' ends, takes gloo's); a rank arrives at its call (gloo), or when its
        NCCL kernel starts."""
        coll, ws, index = self.collectives, self.ws, self.work_index
        on_gpu = coll.on_gpu[index]
        self.work_start = self._shift(ws[coll.work[index]], inclusive=False)
        self.arrived = self._shift(ws[coll.call[index]], inclusive=False)
        self.work_start[on_gpu] = self.arrived[on_gpu] = self.act_start[self.kernel_at]
        self.last_arrival = (
            self.work_start + coll.wait_ns[index]
            if self.arrivals is None
            else self.arrivals[index].astype(np.int64)
        )
        host_works = index[~on_gpu]
        if len(host_works):
            end[find_rows(self.host, coll.work[host_works])] = (
                np.maximum(self.last_arrival[~on_gpu], self.work_start[~on_gpu])
                + coll.transfer_ns[host_works]
            )

    def _shift(self, times: np.ndarray, inclusive: bool) -> np.ndarray:
        """``times`` (warped) plus the waits of the syncs that started before them."""
        if not len(self.sync_starts):
            return times.astype(np.int64)
        count = np.searchsorted(self.sync_starts, times, side="right" if inclusive else "left")
        added = np.where(count > 0, self.sync_delays[np.maximum(count - 1, 0)], 0)
        return (times + added).astype(np.int64)

    # -- step 4 --------------------------------------------------------------------------------
    def critical_path(self) -> tuple[np.ndarray, np.ndarray]:
        """(charged rows, ns) of the step's critical path, walked back from its end. The host's
        stretches between waited syncs are charged piece by piece in one slice each; the walk
        over activities charges one row at a time, into lists (an array each took 60% of it)."""
        p_begin, p_end, p_row = self._host_pieces()
        waited = np.nonzero(np.isin(p_row, list(self.sync_wait)))[0]
        rows: list[np.ndarray] = []
        durs: list[np.ndarray] = []
        one_rows: list[int] = []  # single charges since the last slice, in the walk's order
        one_ns: list[int] = []

        def charge(row: int, ns: int) -> None:
            if ns > 0:
                one_rows.append(row)
                one_ns.append(ns)

        def flush() -> None:
            if one_rows:
                rows.append(np.array(one_rows, dtype=np.int64))
                durs.append(np.array(one_ns, dtype=np.int64))
                one_rows.clear()
                one_ns.clear()

        act_prev, act_end = self.act_prev.tolist(), self.act_end.tolist()
        act_start, act_launch = self.act_start.tolist(), self.act_launch.tolist()
        act_rows, act_launcher = self.act_rows.tolist(), self.act_launcher.tolist()
        t = self.step_end
        act = -1
        if len(act_rows) and self.gpu_end >= self.host_end + self.tail:
            act = int(np.argmax(self.act_end))
            charge(self.step, t - self.gpu_end)  # the closing sync's return
            t = self.gpu_end
        else:
            charge(self.step, min(self.tail, t - self.step_start))
            t -= self.tail
        while t > self.step_start:
            if act >= 0:
                prev = act_prev[act]
                if prev >= 0:  # stream-bound: the one before held it, its dispatch gap too
                    begin = act_end[prev]
                    charge(act_rows[act], t - begin)
                    t, act = begin, prev
                    continue
                # it waited for its launch: the launch's latency, then the host at the launch
                charge(act_rows[act], t - act_start[act])
                t = act_start[act]
                launched = act_launch[act]
                charge(act_launcher[act], t - launched)
                t, act = launched, -1
                continue
            if not len(p_begin) or t <= p_begin[0]:
                charge(self.step, t - self.step_start)  # before the host's first span
                break
            i = min(int(np.searchsorted(p_end, t, side="left")), len(p_end) - 1)
            j = (
                int(waited[np.searchsorted(waited, i, side="right") - 1])
                if (len(waited) and waited[0] <= i)
                else -1
            )
            lo = j + 1
            if lo <= i:  # the host's work back to the waited sync (or its first span)
                ends = np.minimum(p_end[lo : i + 1], t)
                flush()
                rows.append(p_row[lo : i + 1])
                durs.append(np.maximum(ends - p_begin[lo : i + 1], 0))
            if j < 0:
                charge(self.step, int(p_begin[0]) - self.step_start)
                break
            awaited, finish = self.sync_wait[int(p_row[j])]
            sync_end = min(int(p_end[j]), t)
            charge(int(p_row[j]), sync_end - max(finish, int(p_begin[j])))  # its return
            act, t = awaited, min(finish, sync_end)
        flush()
        if not rows:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        all_rows, all_durs = np.concatenate(rows), np.concatenate(durs)
        keep = all_durs > 0
        return all_rows[keep].astype(np.int64), all_durs[keep].astype(np.int64)

    def _host_pieces(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The replayed host timeline from the step's start to the host's end as consecutive
        pieces (begin, end, innermost span; the step where no span covers it). A collective's
        work range (gloo's, on its own thread) covers only the pieces in which a thread waited
        for it: the backward work it ran beside is the host's."""
        working = ~np.isin(self.host, self.collectives.work)
        rows = self.host[working]
        begins, ends = self.host_begin[working], self.host_finish[working]
        if not len(begins):
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        waits = np.asarray(self.waited_on_collectives, dtype=np.int64).reshape(-1, 3)
        bounds = np.sort(np.concatenate(([self.step_start], begins, ends, waits[:, :2].ravel())))
        bounds = bounds[np.concatenate(([True], bounds[1:] != bounds[:-1]))]  # np.unique's
        bounds = bounds[(bounds >= self.step_start) & (bounds <= max(ends.max(), self.step_start))]
        p_begin, p_end = bounds[:-1], bounds[1:]
        middle = p_begin + (p_end - p_begin) // 2
        zeros = np.zeros(len(begins), dtype=np.int64)
        inner = stab(zeros, begins, ends, np.zeros(len(middle), np.int64), middle)
        p_row = np.where(inner >= 0, rows[np.maximum(inner, 0)], self.step)
        for begin, end, work in waits.tolist():
            p_row[(p_row == self.step) & (p_begin >= begin) & (p_end <= end)] = work
        return p_begin, p_end, p_row
