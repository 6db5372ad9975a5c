"""``xsp verify RUN``: measure each suggestion of a measurement by re-running its workload with
the fix the suggestion names, applied without editing the program (``xsp.tracer.workloads
.fixes``).

For each suggestion (``xsp.analysis.suggestions.rules``) whose rule names a fix (its ``Rule.fix``):

1. Re-run the measurement's workload, as its manifest's spec says, untraced (level set M),
   without and with the fix, in ``rounds`` paired rounds, each run a process of its own. The order
   alternates (base then fixed, then fixed then base, ...), so that a host drifting one way
   weighs on both sides alike. Each run is a measurement of its own:
   ``RUN/verify/<rule>/round-<k>/{base,fixed}/``.
2. The gain is the paired rounds' (``xsp.campaign.paired``): mean step time without the fix
   less with it, with a bootstrap confidence interval.
   Each run records its first forward pass's output (``xsp.tracer.workloads.numerics``): a
   fix that changes numerics says by how much, on the same inputs (a seeded program's).
3. Run the fixed workload once more at the original's deepest level set, so that what the fix
   changed shows (the transposes gone, the loader's workers): ``RUN/verify/<rule>/mechanism/``;
   the rule is asked again there, and its evidence after the fix is kept.

A rule without a fix (a host sync at a line of the program) needs a code change and is
reported so, not run. Each suggestion gives one row (``ROW_KEYS``); ``RUN/verify/verify.json``
holds the rows and each rule's runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, cast

from xsp.campaign.paired import paired_gain
from xsp.core import store
from xsp.core.errors import StoreError, XspError
from xsp.core.levelset import LevelSet
from xsp.core.store import RunMeta
from xsp.tracer.spec import ProfileSpec
from xsp.tracer.workloads.numerics import Comparison

DEFAULT_ROUNDS = 3
VERIFY_DIR = "verify"
RESULT_FILE = "verify.json"
MECHANISM_DIR = "mechanism"
UNTRACED = LevelSet("M")

MEASURED = "measured"
CODE_CHANGE = "needs a code change"

#: Every row's keys, in order.
ROW_KEYS = (
    "rule",
    "predicted_gain_ms_per_iteration",
    "measured_gain_ms_per_iteration",
    "measured_gain_ci_ms",
    "measured_gain_pct",
    "numerics_change",
    "rounds",
    "method",
    "status",
    "evidence",
)
GAIN_METHOD = (
    "mean step time without the fix less with it, per round (a pair of processes, or with "
    "--in-process one process timing both sides in alternating blocks), averaged over the "
    "rounds; 95% interval from a two-level bootstrap (rounds, then each round's iterations per "
    "side; 10,000 samples, seed 0)"
)

#: (rule, what is running, runs done, runs in all) -> None
VerifyProgress = Callable[[str, str, int, int], None]


class Suggestion(TypedDict):
    """A row of ``xsp.analysis.suggestions.rules.suggest``."""

    rule: str
    advice: str
    evidence: str
    gain_ms_per_iteration: float | None
    share_pct: float | None
    estimate: str


class Row(TypedDict):
    """A suggestion's row (``ROW_KEYS``): its estimate, what was measured, and its status."""

    rule: str
    predicted_gain_ms_per_iteration: float | None
    measured_gain_ms_per_iteration: float | None
    measured_gain_ci_ms: list[float] | None
    measured_gain_pct: float | None
    numerics_change: bool
    rounds: int
    method: str | None
    status: str
    evidence: str | None


class MeasuredRun(TypedDict):
    """One measurement of the workload (``_Run.record``): where, its steps, its error."""

    path: str
    iterations: int
    step_mean_ms: float | None
    step_median_ms: float | None
    error: str | None


class RoundRun(MeasuredRun):
    """A paired round's run: its round and side (base or fixed)."""

    round: int
    side: str


class RuleAfterFix(TypedDict, total=False):
    """What the rule finds after the fix: whether it fires, its evidence, or why not known."""

    fires: bool | None
    error: str
    evidence: str
    gain_ms_per_iteration: float | None


class MechanismRun(MeasuredRun, total=False):
    """The fixed workload's run at the original's deepest level set, and the rule there."""

    levels: str
    rule_after_fix: RuleAfterFix


class RoundComparison(Comparison, total=False):
    """A round's fixed output against its base output, with the round's number."""

    round: int


class NumericsChange(TypedDict):
    """The fixed output against the base's, each round's and the largest distances."""

    what: str
    relative_l2: float | None
    max_abs: float | None
    rounds: list[RoundComparison]


class RuleDetails(TypedDict):
    """A rule's entry of verify.json's ``details``: the suggestion, the runs, what changed."""

    fix: str | None
    advice: str
    suggestion_evidence: str
    estimate: str
    runs: list[RoundRun]
    numerics: NumericsChange | None
    mechanism: MechanismRun | None


class VerifyDocument(TypedDict):
    """verify.json, and what ``xsp verify --json`` prints."""

    measurement: str
    rounds: int
    gain_method: str
    interrupted: bool
    rows: list[Row]
    details: dict[str, RuleDetails]


@dataclass(frozen=True)
class Original:
    """The measurement to verify, as its manifest says it was made."""

    root: Path
    profile: ProfileSpec
    level_sets: tuple[LevelSet, ...]
    env: dict[str, str]
    cwd: Path | None

    @property
    def deepest(self) -> LevelSet:
        """The timing level set with the most levels (a counter run, MH, replays kernels)."""
        timing = [levels for levels in self.level_sets if not levels.counters] or [UNTRACED]
        return max(timing, key=len)


@dataclass
class RuleResult:
    """One suggestion's verification: its row, and its runs for verify.json."""

    row: Row
    fix: str | None
    advice: str
    suggestion_evidence: str
    estimate: str
    runs: list[RoundRun] = field(default_factory=list)
    mechanism: MechanismRun | None = None
    #: the fixed output against the base's, on the same inputs (``_numerics``)
    numerics: NumericsChange | None = None

    @property
    def failed(self) -> bool:
        return str(self.row["status"]).startswith("failed")

    def record(self) -> RuleDetails:
        return RuleDetails(
            fix=self.fix,
            advice=self.advice,
            suggestion_evidence=self.suggestion_evidence,
            estimate=self.estimate,
            runs=self.runs,
            numerics=self.numerics,
            mechanism=self.mechanism,
        )


@dataclass
class Verification:
    root: Path
    rounds: int
    results: list[RuleResult] = field(default_factory=list)
    interrupted: bool = False

    @property
    def rows(self) -> list[Row]:
        return [r.row for r in self.results]

    def document(self) -> VerifyDocument:
        """verify.json, and what ``xsp verify --json`` prints."""
        return VerifyDocument(
            measurement=str(self.root),
            rounds=self.rounds,
            gain_method=GAIN_METHOD,
            interrupted=self.interrupted,
            rows=self.rows,
            details={r.row["rule"]: r.record() for r in self.results},
        )

    def write(self) -> Path:
        path = self.root / VERIFY_DIR / RESULT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        store.write_json_atomic(path, self.document())
        return path


def load_original(root: Path) -> Original:
    """The measurement's spec from its manifest; XspError, one line, when there is none."""
    if not root.is_dir():
        raise XspError(f"{root}: no such measurement directory")
    path = root / store.MANIFEST
    if not path.exists():
        raise XspError(
            f"{root}: no {store.MANIFEST}: xsp verify re-runs a measurement made by xsp run"
        )
    try:
        manifest = store.read_manifest(path)
    except StoreError as exc:
        raise XspError(f"cannot read {path}: {exc}") from exc
    record = manifest.spec
    if record is None:
        raise XspError(f"{path} has no spec: it does not say what was run, so it cannot re-run")
    names = {f.name for f in dataclasses.fields(ProfileSpec)}
    try:
        profile = ProfileSpec(**{k: v for k, v in record.items() if k in names})
        level_sets = tuple(LevelSet(str(v)) for v in manifest.level_sets or ["M"])
    except (TypeError, ValueError) as exc:
        raise XspError(f"{path}: bad spec: {exc}") from exc
    env = record.get("env")
    env = env if isinstance(env, dict) else {}
    cwd = Path(manifest.cwd) if manifest.cwd is not None else None
    return Original(root, profile, level_sets, {str(k): str(v) for k, v in env.items()}, cwd)


@contextlib.contextmanager
def _working_directory(cwd: Path | None) -> Iterator[None]:
    """Where the original ran (its command's relative paths), when that is known and there."""
    if cwd is None or not cwd.is_dir():
        yield
        return
    with contextlib.chdir(cwd):
        yield


def check_rerun(original: Original, fixes: Sequence[str]) -> None:
    """Refuse, before anything runs, a workload that cannot run here again (a script gone, a
    device missing); XspError, one line."""
    from xsp.tracer.run.plan import LeveledSpec, validate

    out = (original.root / VERIFY_DIR).resolve()
    profile = dataclasses.replace(original.profile, fixes=tuple(fixes))
    level_sets = tuple(dict.fromkeys([UNTRACED, original.deepest]))
    try:
        with _working_directory(original.cwd):
            validate(LeveledSpec(out=out, profile=profile, level_sets=level_sets))
    except XspError as exc:
        raise XspError(f"cannot re-run the workload of {original.root}: {exc}") from exc


def suggestions(root: Path) -> list[Suggestion]:
    """The measurement's suggestions (rows of ``xsp.analysis.suggestions.rules.suggest``)."""
    from xsp.analysis.measurement.store import MeasurementStore
    from xsp.analysis.suggestions.rules import suggest

    measurement = MeasurementStore(root)
    measurement.require_spans()
    return cast(list[Suggestion], suggest(measurement).to_pylist())


@dataclass(frozen=True)
class Plan:
    """What ``run_plan`` verifies: the measurement, its suggestions (rows of ``suggest``), and
    the rounds."""

    original: Original
    suggestions: list[Suggestion]
    rounds: int
    #: each round one process timing both sides in alternating blocks, where the fix allows
    in_process: bool = False


def plan(
    root: Path, rounds: int = DEFAULT_ROUNDS, rules: Sequence[str] = (), in_process: bool = False
) -> Plan:
    """Check, before anything runs, that the measurement ``root`` can be verified (for the
    suggestions of ``rules`` only, when given); XspError, one line, when it cannot: no manifest
    or spec, no suggestions, a workload that cannot run here again, ``in_process`` for a
    command (one process builds a zoo model twice; a program runs once)."""
    if rounds < 1:
        raise XspError(f"bad --rounds {rounds}: must be at least 1")
    root = root.resolve() if root.exists() else root
    original = load_original(root)
    if in_process and original.profile.model is None:
        raise XspError(
            f"{root} ran a command ({original.profile.workload}): --in-process times a zoo "
            "model built twice in one process; verify it in paired processes (no --in-process)"
        )
    found = suggestions(root)
    if rules:
        unknown = sorted(set(rules) - {s["rule"] for s in found})
        if unknown:
            raise XspError(f"{root}: no suggestion {', '.join(unknown)} to verify")
        found = [s for s in found if s["rule"] in rules]
    if not found:
        raise XspError(f"{root}: no suggestions to verify (xsp analyze {root} lists them)")
    fixes = {fix for s in found if (fix := fix_for(s["rule"])) is not None}
    if fixes:
        check_rerun(original, sorted({*original.profile.fixes, *fixes}))
    return Plan(original, found, rounds, in_process)


def verify(
    root: Path,
    rounds: int = DEFAULT_ROUNDS,
    rules: Sequence[str] = (),
    progress: VerifyProgress | None = None,
    in_process: bool = False,
) -> Verification:
    """``run_plan(plan(root, rounds, rules, in_process), progress)``."""
    return run_plan(plan(root, rounds, rules, in_process), progress)


def run_plan(planned: Plan, progress: VerifyProgress | None = None) -> Verification:
    """Verify each planned suggestion; writes ``verify/verify.json`` as each rule ends."""
    original, rounds = planned.original, planned.rounds
    result = Verification(original.root, rounds)
    for suggestion in planned.suggestions:
        rule = suggestion["rule"]
        fix = fix_for(rule)
        if result.interrupted:
            result.results.append(_unrun(suggestion, "not run: interrupted", fix))
            continue
        if fix is None:
            result.results.append(_unrun(suggestion, CODE_CHANGE))
            continue
        already = _already_applied(original.profile, fix)
        if already:
            result.results.append(_unrun(suggestion, f"not run: {already}", fix))
            continue
        target = original.root / VERIFY_DIR / rule
        shutil.rmtree(target, ignore_errors=True)  # an earlier verification's runs
        rule_result, interrupted = _verify_rule(planned, suggestion, fix, target, progress)
        result.results.append(rule_result)
        result.interrupted = interrupted
        result.write()
    result.write()
    return result


def _already_applied(profile: ProfileSpec, fix: str) -> str | None:
    if fix in profile.fixes:
        return f"the measurement applied the {fix} fix already"
    if fix == "channels_last" and profile.channels_last:
        return "the measurement ran the zoo model channels_last already"
    return None


def fix_for(rule: str) -> str | None:
    """The fix (``xsp.tracer.workloads.fixes``) that answers the suggestion rule named ``rule``,
    as the rule declares it (None: it needs a change to the program's code)."""
    from xsp.analysis.suggestions.rules import RULES_BY_NAME

    found = RULES_BY_NAME.get(rule)
    return found.fix if found is not None else None


#: Why an estimate from ops timed in isolation (``xsp estimate``) can miss the fix's gain.
ISOLATION_NOTE = (
    "the ops were timed one at a time; in the step they share caches and overlap other work, "
    "and what the fix changes besides them (the elementwise ops on NHWC tensors, casts) was "
    "not timed"
)


def _estimate_note(rule: str, estimate: str = "") -> str | None:
    """Why the rule's estimate and its fix's measurement can differ: as the rule declares it
    for its model, ``ISOLATION_NOTE`` for ops timed in isolation."""
    from xsp.analysis.estimates import ISOLATION
    from xsp.analysis.suggestions.rules import RULES_BY_NAME

    if estimate.startswith(ISOLATION):
        return ISOLATION_NOTE
    found = RULES_BY_NAME.get(rule)
    return found.estimate_note if found is not None else None


def _row(suggestion: Suggestion, status: str, fix: str | None) -> Row:
    from xsp.tracer.workloads.fixes import FIXES

    return Row(
        rule=suggestion["rule"],
        predicted_gain_ms_per_iteration=suggestion["gain_ms_per_iteration"],
        measured_gain_ms_per_iteration=None,
        measured_gain_ci_ms=None,
        measured_gain_pct=None,
        numerics_change=FIXES[fix].changes_numerics if fix else False,
        rounds=0,
        method=None,
        status=status,
        evidence=None,
    )


def _unrun(suggestion: Suggestion, status: str, fix: str | None = None) -> RuleResult:
    return RuleResult(
        _row(suggestion, status, fix),
        fix,
        suggestion["advice"],
        suggestion["evidence"],
        suggestion["estimate"],
    )


def _verify_rule(
    planned: Plan,
    suggestion: Suggestion,
    fix: str,
    target: Path,
    progress: VerifyProgress | None,
) -> tuple[RuleResult, bool]:
    """The rounds (paired processes, or processes alternating both sides), then the mechanism
    run; (the result, whether Ctrl-C stopped it)."""
    from xsp.tracer.workloads.alternating import refusal

    original, rounds, rule = planned.original, planned.rounds, suggestion["rule"]
    result = _unrun(suggestion, MEASURED, fix)
    result.row["evidence"] = str(target)
    has_mechanism = original.deepest != UNTRACED
    refused = refusal(fix) if planned.in_process else None
    alternating = planned.in_process and refused is None
    rounds_run = rounds if alternating else 2 * rounds
    counter = _Counter(rule, rounds_run + int(has_mechanism), progress)
    if alternating:
        result.row["method"] = IN_ONE_PROCESS
        steps, interrupted = _alternated_rounds(original, fix, rounds, target, result, counter)
    else:
        result.row["method"] = PAIRED if refused is None else f"{PAIRED} ({refused})"
        steps, interrupted = _paired_rounds(original, fix, rounds, target, result, counter)
    if steps is None:
        return result, interrupted
    gain = paired_gain(steps["base"], steps["fixed"])
    result.row["measured_gain_ms_per_iteration"] = gain.gain_ms
    result.row["measured_gain_ci_ms"] = list(gain.ci_ms)
    result.row["measured_gain_pct"] = gain.gain_pct
    result.row["rounds"] = gain.rounds
    if has_mechanism:
        out = target / MECHANISM_DIR
        fixed = tuple(dict.fromkeys([*original.profile.fixes, fix]))
        run = _measure(original, fixed, original.deepest, out, "mechanism", counter)
        result.mechanism = {"path": str(out), "levels": str(original.deepest), **run.record()}
        if run.failure is None:
            result.mechanism["rule_after_fix"] = _rule_after_fix(out, rule)
        return result, run.interrupted
    return result, False


#: ``Row.method``: how the rounds ran.
PAIRED = "paired processes"
IN_ONE_PROCESS = "alternating in one process"

#: Each side's step times (ms), one list per round; None where a run failed or was stopped.
RoundSteps = dict[str, list[list[float]]] | None


@dataclass
class _Counter:
    """The rule's progress: runs done of ``total``, forwarded to the bar."""

    rule: str
    total: int
    progress: VerifyProgress | None
    done: int = 0

    def show(self, what: str) -> None:
        if self.progress is not None:
            self.progress(self.rule, what, self.done, self.total)

    def finished(self, what: str) -> None:
        self.done += 1
        self.show(what)


def _paired_rounds(
    original: Original, fix: str, rounds: int, target: Path, result: RuleResult, counter: _Counter
) -> tuple[RoundSteps, bool]:
    """Each round a process without the fix and one with it, the order alternating."""
    fixed = tuple(dict.fromkeys([*original.profile.fixes, fix]))
    sides = {"base": original.profile.fixes, "fixed": fixed}
    steps: dict[str, list[list[float]]] = {"base": [], "fixed": []}
    for k in range(1, rounds + 1):
        order = ("base", "fixed") if k % 2 else ("fixed", "base")  # ABBA: drift weighs alike
        for side in order:
            label = f"round {k}/{rounds} {side}"
            out = target / f"round-{k}" / side
            run = _measure(original, sides[side], UNTRACED, out, label, counter)
            result.runs.append(RoundRun(round=k, side=side, **run.record()))
            if run.interrupted:
                result.row["status"] = "not run: interrupted"
                return None, True
            if run.failure is not None:
                result.row["status"] = f"failed: {label}: {run.failure}"
                return None, False
            steps[side].append(run.steps_ms)
    result.numerics = _numerics(target, rounds)
    return steps, False


def _alternated_rounds(
    original: Original, fix: str, rounds: int, target: Path, result: RuleResult, counter: _Counter
) -> tuple[RoundSteps, bool]:
    """Each round one process timing both sides in alternating blocks (``in_process``)."""
    from xsp.campaign.in_process import run_process

    steps: dict[str, list[list[float]]] = {"base": [], "fixed": []}
    compared: list[RoundComparison] = []
    for k in range(1, rounds + 1):
        label = f"process {k}/{rounds}, both sides alternating"
        counter.show(label)
        try:
            out = target / f"process-{k}"
            done = run_process(original.profile, fix, original.env, out)
        except KeyboardInterrupt:
            result.row["status"] = "not run: interrupted"
            return None, True
        counter.finished(label)
        for side in ("base", "fixed"):
            run = _Run(done.path, done.steps_ms[side], done.error, False)
            result.runs.append(RoundRun(round=k, side=side, **run.record()))
        if done.error is not None:
            result.row["status"] = f"failed: {label}: {done.error}"
            return None, False
        for side in ("base", "fixed"):
            steps[side].append(done.steps_ms[side])
        if done.numerics is not None:
            compared.append(RoundComparison(round=k, **done.numerics))
    result.numerics = _numerics_change(compared)
    return steps, False


def _numerics(target: Path, rounds: int) -> NumericsChange | None:
    """Each round's fixed output against its base output on the same inputs (the first
    forward pass, ``xsp.tracer.workloads.numerics``), and the largest relative difference;
    None when the runs recorded none."""
    from xsp.tracer.workloads import numerics

    compared: list[RoundComparison] = []  # each round's comparison, with its number
    for k in range(1, rounds + 1):
        base = numerics.read(target / f"round-{k}" / "base" / str(UNTRACED))
        fixed = numerics.read(target / f"round-{k}" / "fixed" / str(UNTRACED))
        if base is not None and fixed is not None:
            comparison = numerics.compare(base, fixed)
            compared.append(RoundComparison(round=k, **comparison))
    return _numerics_change(compared)


def _numerics_change(compared: list[RoundComparison]) -> NumericsChange | None:
    """The rounds' comparisons, and the largest distances of those on the same inputs."""
    if not compared:
        return None
    comparable = [c for c in compared if c.get("comparable")]
    return NumericsChange(
        what="the first forward pass's output, without and with the fix, on the same inputs",
        relative_l2=max((c["relative_l2"] for c in comparable), default=None),
        max_abs=max((c["max_abs"] for c in comparable), default=None),
        rounds=compared,
    )


@dataclass
class _Run:
    path: Path
    steps_ms: list[float]
    failure: str | None
    interrupted: bool

    def record(self) -> MeasuredRun:
        steps = sorted(self.steps_ms)
        return MeasuredRun(
            path=str(self.path),
            iterations=len(steps),
            step_mean_ms=sum(steps) / len(steps) if steps else None,
            step_median_ms=steps[len(steps) // 2] if steps else None,
            error=self.failure,
        )


def _measure(
    original: Original,
    fixes: Sequence[str],
    levels: LevelSet,
    out: Path,
    label: str,
    counter: _Counter,
) -> _Run:
    """One measurement of the original's workload at ``levels`` with ``fixes``, into ``out``;
    its complete steps' times (ms) from the run of ``levels``."""
    from xsp.core import config
    from xsp.tracer.run.runner import LeveledSpec, run_leveled

    profile = dataclasses.replace(
        original.profile,
        fixes=tuple(fixes),
        otlp_endpoint=None,
        # the first forward pass's output, compared across sides; never inside the measured
        # iterations (it reads the output back to the host)
        numerics_probe=levels == UNTRACED and original.profile.warmup > 0,
    )
    spec = LeveledSpec(
        out=out.resolve(),
        profile=profile,
        level_sets=(levels,),
        env=original.env,
        # a zoo model's rounds fork from one server that imported torch and the zoo once
        fork_server=config.switch("XSP_FORK_SERVER", True),
    )

    def forward(_: str, phase: str, step: int, steps: int) -> None:
        counter.show(label if phase in ("start", "end") else f"{label}: {phase} {step}/{steps}")

    forward(str(levels), "start", 0, 0)
    with _working_directory(original.cwd):
        finished = run_leveled(spec, forward)
    counter.finished(label)
    failure = finished.failure
    steps: list[float] = []
    if failure is None:
        run = store.open_run(out / str(levels))
        failure = _fix_failure(run.document)
        steps = _steps_ms(run)
        if not steps and failure is None:
            failure = "no complete step was measured"
    return _Run(out, steps, failure, finished.interrupted)


def _fix_failure(meta: RunMeta) -> str | None:
    """A fix that could not apply (the level-set process wrote it into run.json)."""
    return next((e for e in meta.errors or () if e.startswith("fix ")), None)


def _steps_ms(run: store.Run) -> list[float]:
    """The run's complete steps (no failed or cut-short one), in ms."""
    spans = run.spans().select(["kind", "dur_ns", "status_message"]).to_pylist()
    return [s["dur_ns"] / 1e6 for s in spans if s["kind"] == "step" and s["status_message"] is None]


def _rule_after_fix(out: Path, rule: str) -> RuleAfterFix:
    """What the rule finds in the fixed workload's traced run: its evidence (the transposes
    left, the loader's batches) or that it no longer fires."""
    try:
        after = {s["rule"]: s for s in suggestions(out)}.get(rule)
    except Exception as exc:  # the runs are stored whatever the analysis makes of them
        return RuleAfterFix(fires=None, error=f"{type(exc).__name__}: {exc}")
    if after is None:
        return RuleAfterFix(fires=False)
    return RuleAfterFix(
        fires=True,
        evidence=after["evidence"],
        gain_ms_per_iteration=after["gain_ms_per_iteration"],
    )


def summary_line(result: RuleResult) -> str:
    """ "estimated X ms, measured Y ms ± Z (n rounds)", or the status of a rule not measured
    (with the advice, for a code change)."""
    row = result.row
    if row["status"] == CODE_CHANGE:
        return f"{row['rule']}: {CODE_CHANGE}: {result.advice}"
    if row["status"] != MEASURED:
        return f"{row['rule']}: {row['status']}"
    predicted = row["predicted_gain_ms_per_iteration"]
    interval = row["measured_gain_ci_ms"]
    assert interval is not None  # a measured row has its interval
    low, high = interval
    estimated = f"estimated {predicted:.2f} ms" if predicted is not None else "no estimate"
    rounds = row["rounds"]
    alternating = row.get("method") == IN_ONE_PROCESS  # a verify.json before it: paired
    plural = rounds != 1
    how = (
        f"{rounds} process{'es' if plural else ''}, both sides alternating in each"
        if alternating
        else f"{rounds} round{'s' if plural else ''}"
    )
    line = (
        f"{row['rule']}: {estimated}, measured {row['measured_gain_ms_per_iteration']:.2f} ms "
        f"± {(high - low) / 2:.2f} ({how})"
    )
    if row["measured_gain_pct"] is not None:
        line += f", {row['measured_gain_pct']:.1f}% of the step"
    if row["numerics_change"]:
        line += "; changes numerics"
        change = result.numerics["relative_l2"] if result.numerics else None
        if change is not None:
            line += f" (output {change:.2g} relative L2 from the base's on the same inputs)"
    if low <= 0.0 <= high:
        line += f"; {UNRESOLVED_IN_ONE_PROCESS if alternating else UNRESOLVED_NOTE}"
    elif predicted is not None and not low <= predicted <= high:
        line += "; the estimate lies outside the measured interval"
        note = _estimate_note(row["rule"], result.estimate)
        if note is not None:
            line += f": {note}"
    return line


#: The verify line's note where the measured interval holds no gain at all.
UNRESOLVED_NOTE = (
    "the interval holds 0: the gain is below the drift between processes (a host-bound step "
    "moves up to ±25% between them with nothing changed); more --rounds narrow it, and for a "
    "zoo model --in-process times both sides in each process"
)
#: The same note for rounds that alternated both sides inside each process.
UNRESOLVED_IN_ONE_PROCESS = (
    "the interval holds 0: the gain is below the step's own noise; more --rounds narrow it"
)


__all__ = [
    "DEFAULT_ROUNDS",
    "IN_ONE_PROCESS",
    "PAIRED",
    "ROW_KEYS",
    "UNRESOLVED_IN_ONE_PROCESS",
    "UNRESOLVED_NOTE",
    "Plan",
    "Verification",
    "fix_for",
    "load_original",
    "plan",
    "run_plan",
    "summary_line",
    "verify",
]
