"""How a rollout samples, validated before anything runs.

The per-call values (the RL step whose number enters every request's uid, and whether to keep
the policy's states for drafter training) are not configuration: they are arguments of the
call (``RolloutEngine.rollout(..., rl_step=..., harvest=...)``)."""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import check_bool, check_choice, check_int
from .compiled import check_compile
from .sampling import SamplingParams

__all__ = ["RolloutConfig", "SPEC_MODES", "BATCHING"]

SPEC_MODES = ("coupled", "speculative")
BATCHING = ("continuous", "waves")


@dataclass(frozen=True)
class RolloutConfig:
    """How a rollout samples (the per-call values are the call's arguments: module docstring).

    Args:
        max_new_tokens: response length cap per request (finish = "length" when reached).
        temperature, top_p, seed: sampling (temperature 0 = greedy); see SamplingParams.
            ``seed`` is an integer in [0, 2**64).
        samples_per_prompt: responses per prompt (a GRPO group).
        workers: N workers the requests are sharded over (the GPUs of a synchronous step).
        max_batch_size: rows decoded together on a worker; None = the whole shard at once.
        batching: when a worker's shard is larger than ``max_batch_size``: ``"continuous"``
            refills the slot of a finished row at once with the next waiting request (its
            prefill joins the running batch, as in vLLM and SGLang), so the batch stays full
            until the queue empties; ``"waves"`` decodes ``max_batch_size`` requests until the
            last of them finishes, then the next wave.
        refill_slots: continuous batching refills once this many slots are free (or every
            waiting request fits); 1 refills each finished row's slot at once. Each refill is
            one prefill forward, which costs about half a decode step of a full batch on a
            CPU, so refilling slots one by one costs more than the few steps a slot waits.
            ``None``: an eighth of ``max_batch_size`` (1 below a batch of 16).
        spec_k: draft tokens per speculative step when a drafter is given without a schedule.
        spec_mode: verification when sampling (temperature > 0): "coupled" (output token-
            identical to the plain coupled rollout) or "speculative" (the rejection-sampling
            rule of Leviathan et al.; same distribution, different draws). Greedy verifies by
            exact match.
        ignore_eos: decode ``max_new_tokens`` for every row even past EOS, so that models
            are timed on the same number of tokens (throughput comparisons of pruned models,
            whose responses end at different lengths).
        compile: the plain decode step and the verify pass compiled with ``torch.compile``
            over a KV cache preallocated to the rollout's length (``rollout.compiled``; the
            lean forward's models: Llama, Qwen2, Mistral, Qwen3), and with ``True`` an EAGLE
            head's draft step too (``speculative.eagle.CompiledDraft``; the prefill stays
            eager): ``False`` (eager, the default), ``True``, or ``"auto"``
            (times both at each bucket of batch size and fed tokens on its first steps and
            keeps the faster: ``RolloutResult.compile_choices``, which an RL run saves in its
            checkpoint and reuses, untimed, on resume). A compile is a ``compile`` row of the
            timeline, empty on the sim clock. Float64 greedy, coupled and speculative tokens
            equal the eager path's (tests/test_compiled_lossless.py).
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    samples_per_prompt: int = 1
    workers: int = 1
    max_batch_size: int | None = None
    batching: str = "continuous"
    refill_slots: int | None = None
    spec_k: int = 4
    spec_mode: str = "coupled"
    ignore_eos: bool = False
    compile: bool | str = False

    def __post_init__(self):
        """Refuse bad fields at construction, each through the shared checks (docs/design.md,
        "Bad input gets a clear error"), and store counts as plain ints."""
        check_choice("spec_mode", self.spec_mode, SPEC_MODES)
        check_choice("batching", self.batching, BATCHING)
        counts = {"workers": 1, "max_new_tokens": 1, "spec_k": 1, "samples_per_prompt": 1}
        for name, low in counts.items():
            object.__setattr__(self, name, check_int(name, getattr(self, name), low))
        for name in ("max_batch_size", "refill_slots"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1,
                                                     optional=True))
        object.__setattr__(self, "ignore_eos", check_bool("ignore_eos", self.ignore_eos))
        check_compile(self.compile)
        self.sampling  # validates temperature, top_p and seed

    def refill_for(self, batch_size: int) -> int:
        """Free slots that trigger a refill of a continuous batch of ``batch_size``."""
        return self.refill_slots or max(1, batch_size // 8)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.seed)
