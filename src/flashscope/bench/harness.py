"""The benchmark loop: validate, then time, then validate the timed result, per provider
and case; speedups against a baseline measured in the same run.

Per provider and case, in order: availability (reason recorded), support for the shape and
mode, validation on the small odd shapes of the case's kind (once per kind), validation of
the case itself on two fresh input sets (:func:`flashscope.bench.validate.check_step`), peak
memory of one call, the median time of the validated step, and a check of the last timed
call's output. Any failure leaves the case without a speed number and with the reason;
an error after which the GPU no longer answers (an illegal address loses the CUDA context
for every caller) stops the run: each later result says where it was lost.

With ``Timer.rounds = R > 1``, every provider that passed a case is timed R - 1 more times
once all have had their first, in rounds whose order is a fresh (seeded) permutation
(:func:`flashscope.bench.timing.round_orders`), and its ``ms`` is the median of the R
(all kept in ``ms_rounds``). A GPU's clock drifts with its temperature and power over
a suite (in one H100 measurement the same kernel read 3.83 ms first and 4.16 ms twenty
seconds later), so providers timed one after the other once each inherit the drift as a
bias; interleaved rounds spread it over all of them, and the shuffled order keeps any
provider from mostly following the same one. Each extra timing's output is checked like
the first.

FLOPs (:func:`flashscope.bench.suite.case_flops`): 4 B H Nq Nk D, x0.5 when causal, per
sequence of a packed case, or with a window 4 H D per (query, key) pair the mask keeps;
x2.5 for the backward, x3.5 for forward+backward. Percent of the copy ceiling uses the
minimum bytes (:func:`flashscope.bench.suite.case_min_bytes`) over the measured time.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from ..errors import FlashscopeError
from .providers import FEATURES
from .suite import Case, case_flops, case_min_bytes, odd_cases, validation_key
from .timing import Timer, host_bound, peak_memory_mib, round_orders

STATUSES = ("ok", "failed", "error", "unsupported", "unavailable")
#: the end of the reason of the result whose error lost the GPU context
LOST_HERE = "the GPU context is lost: nothing runs after this"
BASELINE_ORDER = ("sdpa-cudnn", "fa4", "sdpa-flash", "fa2", "sdpa-efficient", "sdpa-math")


@dataclass
class Result:
    provider: str
    case: Case
    status: str
    reason: str = ""
    ms: Optional[float] = None
    tflops: Optional[float] = None
    speedup: Optional[float] = None
    pct_gemm: Optional[float] = None
    pct_copy: Optional[float] = None
    gbps: Optional[float] = None  #: bytes read per second, decoding (:mod:`.decode`)
    peak_mib: Optional[float] = None
    host_us: Optional[float] = None
    #: the host took at least half as long to queue a call as the events measured (None:
    #: not known, or a timer that keeps the host out): part of the time may be the host's
    #: (:func:`.timing.host_bound`)
    host_bound: Optional[bool] = None
    max_rel_error: Optional[float] = None
    validated_shapes: list = field(default_factory=list)
    ms_rounds: list = field(default_factory=list)

    def row(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "case"}
        d.update(asdict(self.case))
        d["shape"] = self.case.shape
        return d


def choose_baseline(providers, requested: Optional[str], device) -> Optional[str]:
    names = [p.name for p in providers]
    if requested is not None:
        if requested not in names:
            raise FlashscopeError(f"--baseline {requested!r}: not among the selected "
                                  f"providers ({', '.join(names)})")
        return requested
    usable = [p.name for p in providers if p.baseline and p.available(device) is None]
    return next((n for n in BASELINE_ORDER if n in usable), usable[0] if usable else None)


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def _unsupported(p, case: Case) -> Optional[str]:
    if case.mode != "fwd" and not p.has_backward:
        return "no backward"
    if case.gqa and not p.gqa:
        return "no GQA"
    missing = sorted(case.needs - p.features)
    if missing:
        return FEATURES[missing[0]]
    return p.supports(case)


class _Runner:
    def __init__(self, device, timer, options, ceilings, odd_shapes, log):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.timer = timer
        self.options = options
        self.ceilings = ceilings
        self.odd_shapes = odd_shapes
        self.log = log
        self.odd_verdict = {}
        self.kept = {}  # provider -> (step, ref, inputs) of the current case, for rounds
        self.lost = ""  # the reason every later result gets once the GPU context is lost

    def check_context(self, failed: Result) -> None:
        """After the error of ``failed``: whether the GPU still answers. An illegal
        address or a trap leaves the CUDA context broken, and every later call fails with
        the same error whoever makes it (a bench once blamed two peers for one
        provider's fault); from then on nothing runs and each result says where the
        context was lost (:attr:`lost`), and ``failed``'s reason says it lost it."""
        why = "" if self.lost else self._unanswered()
        if why:
            self.lost = (f"not run: the GPU context was lost at {failed.provider} "
                         f"{failed.case.shape} ({why})")
            failed.reason += f"; {LOST_HERE}"

    def _unanswered(self) -> str:
        """'' while the device answers a synchronize, else the error it raised."""
        if self.device.type != "cuda":
            return ""
        try:
            self.torch.cuda.synchronize(self.device)
        except Exception as e:
            return _short(e)
        return ""

    def _validate(self, p, case: Case):
        from .validate import check_step, make_step

        fn = p.build(case, self.options)
        return check_step(lambda inp: make_step(fn, case, inp), case, p.layout, self.device)

    def _odd(self, p, case: Case) -> tuple:
        """(reason or None, shapes checked) for the odd shapes of ``case``'s kind."""
        from .validate import ValidationFailure

        key = (p.name, validation_key(case))
        if key not in self.odd_verdict:
            verdict, shapes = None, []
            for odd in odd_cases(case, gqa=p.gqa):
                if _unsupported(p, odd):
                    continue
                try:
                    self._validate(p, odd)
                    shapes.append(odd.shape)
                except ValidationFailure as e:
                    verdict = f"validation at {odd.shape}: {e}"
                    break
                except Exception as e:
                    verdict = f"error at {odd.shape}: {_short(e)}"
                    break
            self.odd_verdict[key] = (verdict, shapes)
        return self.odd_verdict[key]

    def one(self, p, case: Case) -> Result:
        from .validate import ValidationFailure

        why = _unsupported(p, case)
        if why:
            return Result(p.name, case, "unsupported", why)
        shapes = []
        if self.odd_shapes:
            verdict, shapes = self._odd(p, case)
            if verdict:
                return Result(p.name, case, "failed" if verdict.startswith("validation")
                              else "error", verdict, validated_shapes=shapes)
        try:
            inp, ref, step, err = self._validate(p, case)
            shapes = shapes + [case.shape]
            peak = peak_memory_mib(step, self.device.type)
            ms = self.timer.time(step)
            err = max(err, self._check_timed(self.timer.last, ref, case, inp))
            host = self.timer.host_us(step)
            if self.timer.rounds > 1:
                self.kept[p.name] = (step, ref, inp)
        except ValidationFailure as e:
            return Result(p.name, case, "failed", f"validation at {case.shape}: {e}",
                          validated_shapes=shapes)
        except Exception as e:
            if self.device.type == "cuda":
                try:
                    self.torch.cuda.empty_cache()
                except Exception:  # the context is lost: run_bench's check says so
                    pass
            return Result(p.name, case, "error", _short(e), validated_shapes=shapes)
        finally:
            self.timer.last = None
        return self._host(self._rate(Result(p.name, case, "ok", ms=ms, peak_mib=peak,
                                            host_us=host, max_rel_error=err,
                                            validated_shapes=shapes, ms_rounds=[ms])))

    def _check_timed(self, result, ref, case: Case, inp) -> float:
        from .validate import check_timed_result

        return check_timed_result(result, ref, case, inp)

    def _rate(self, res: Result) -> Result:
        """Fill the rates derived from ``res.ms``."""
        c, ms = res.case, res.ms
        flops = _flops(c)
        res.tflops = flops / (ms * 1e-3) / 1e12
        if self.ceilings is not None:
            res.pct_gemm = 100 * flops / (ms * 1e-3) / self.ceilings.flops
            nbytes = case_min_bytes(c)
            res.pct_copy = 100 * nbytes / (ms * 1e-3) / self.ceilings.bandwidth
        return res

    def _host(self, res: Result) -> Result:
        """Mark a result whose events may have timed the host (:func:`.timing.host_bound`);
        the tables say so (:func:`.output.reason`)."""
        res.host_bound = host_bound(res.host_us, res.ms, self.timer)
        return res

    def more_rounds(self, results: list) -> None:
        """Rounds 2..R over the providers of one case that passed (module docstring)."""
        import statistics

        from .validate import ValidationFailure

        ok = [r for r in results if r.status == "ok" and r.provider in self.kept]
        try:
            for k, order in enumerate(round_orders(len(ok), self.timer.rounds - 1), 1):
                for r in (ok[i] for i in order):
                    if r.status != "ok" or self.lost:  # a lost context: the rounds so far
                        continue
                    step, ref, inp = self.kept[r.provider]
                    try:
                        r.ms_rounds.append(self.timer.time(step))
                        r.max_rel_error = max(r.max_rel_error, self._check_timed(
                            self.timer.last, ref, r.case, inp))
                    except ValidationFailure as e:
                        _drop(r, "failed", f"validation at {r.case.shape}, round {k + 1}: {e}")
                    except Exception as e:
                        _drop(r, "error", f"round {k + 1}: {_short(e)}")
                        self.check_context(r)
                    finally:
                        self.timer.last = None
        finally:
            self.kept.clear()
        for r in ok:
            if r.status == "ok":
                r.ms = statistics.median(r.ms_rounds)
                self._host(self._rate(r))


@functools.lru_cache(maxsize=1024)
def _flops(case: Case) -> float:
    """:func:`case_flops`, once per case (a window's pairs are counted row by row)."""
    return case_flops(case)


def _drop(r: Result, status: str, reason: str) -> None:
    """A result that failed a later round loses its numbers, like a first-round failure."""
    r.status, r.reason = status, reason
    r.ms = r.tflops = r.pct_gemm = r.pct_copy = r.gbps = None


def run_bench(cases, providers, *, device="cuda", timer: Optional[Timer] = None,
              baseline: Optional[str] = None, options: Optional[dict] = None,
              ceilings=None, odd_shapes: bool = True,
              log: Optional[Callable] = None, runner: type = None) -> tuple:
    """Run every (case, provider); returns (results, baseline name). ``ceilings`` is a
    :class:`flashscope.roofline.Ceilings` measured in this run (or None); ``runner`` the
    class that validates, times and rates one (default the attention cases' own;
    :class:`flashscope.bench.decode.DecodeRunner` for decoding steps)."""
    import torch

    if not cases:
        raise FlashscopeError("no benchmark cases selected (check --shape/--suite/--mode)")
    if not providers:
        raise FlashscopeError("no providers selected (check --only/--skip)")
    dev = torch.device(device)
    timer = timer or Timer(device=dev.type)
    base = choose_baseline(providers, baseline, dev)
    runner = (runner or _Runner)(dev, timer, dict(options or {}), ceilings, odd_shapes, log)
    avail = {p.name: p.available(dev) for p in providers}
    results = []
    for case in cases:
        done = []
        for p in providers:
            if avail[p.name]:
                r = Result(p.name, case, "unavailable", avail[p.name])
            elif runner.lost:
                r = Result(p.name, case, "error", runner.lost)
            else:
                r = runner.one(p, case)
                if r.status == "error":
                    runner.check_context(r)
            done.append(r)
            if log and timer.rounds == 1:
                log(r)
        if timer.rounds > 1:
            runner.more_rounds(done)
            for r in done:
                if log:
                    log(r)
        results.extend(done)
    by_case = {}
    for r in results:
        by_case.setdefault(r.case, {})[r.provider] = r
    for r in results:
        ref = by_case[r.case].get(base)
        if r.ms and ref is not None and ref.ms:
            r.speedup = ref.ms / r.ms
    return results, base
