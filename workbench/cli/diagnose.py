"""``workbench diagnose``: why didn't TLT pay? A diagnosis of a run's own RL logs
(docs/diagnose.md)."""
from __future__ import annotations

import sys

__all__ = ["add"]


def add(sub) -> None:
    dg = sub.add_parser("diagnose", help="why didn't TLT pay? a diagnosis of a run's own RL "
                        "logs: step split, long tail, live batch vs SD, remedies "
                        "(docs/diagnose.md)")
    dg.add_argument("logs", metavar="LOGS", help="a metrics file or folder of veRL, OpenRLHF "
                    "or TRL, or a workbench run folder (notebook 04 or 11)")
    dg.add_argument("--format", default=None, help="verl, openrlhf, trl or workbench "
                    "(default: guessed from the logs)")
    dg.add_argument("--out", required=True, help="the report's folder (missing, empty, or an "
                    "earlier diagnosis)")
    dg.add_argument("--sd-curve", default=None, help="SD's speedup per batch size on your "
                    "hardware: a CSV (batch_size, speedup) or notebook 02's curve.csv")
    dg.add_argument("--workers", type=int, default=None, help="the rollout's workers "
                    "(default: what the logs tell)")
    dg.add_argument("--baseline", default=None, help="the same run's logs without SD, to "
                    "compare lengths with")
    dg.add_argument("--drafter-step-s", type=float, default=None,
                    help="one drafter training step's seconds (drafter steps the idle windows hold)")
    dg.add_argument("--rollout-dump", default=None, help="veRL: its trainer.rollout_data_dir "
                    "(<step>.jsonl files: per-request lengths; default: LOGS/rollout_data)")
    dg.set_defaults(func=diagnose)


def diagnose(args) -> int:
    """Exit 0 with the report written, 2 for logs, a format, a curve or an --out that cannot
    work (one message naming the value and what is accepted; nothing written)."""
    from ..diagnose import diagnose_logs
    try:
        page, diagnosis = diagnose_logs(args.logs, args.out, format=args.format,
                                        sd_curve=args.sd_curve, workers=args.workers,
                                        baseline=args.baseline,
                                        drafter_step_s=args.drafter_step_s,
                                        rollout_dump=args.rollout_dump)
    except (ValueError, OSError) as exc:
        print(f"workbench diagnose: error: {exc}", file=sys.stderr)
        return 2
    print(diagnosis.reading())
    print(f"report: {page}")
    return 0
