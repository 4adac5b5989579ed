"""``python -m pipelines.resend FILE [TRACKING_URI]``: send epoch metrics a lost tracking store did not receive.

The train stage writes ``unsent_metrics.json`` next to its outputs when the store stops answering for good
(see :class:`pipelines.tracking.TrackingUnavailableError`); this sends them to the same run once it is back.
A server still down is reported within the stages' 5 s connect timeout; store calls retry as the stages' do.
"""

from __future__ import annotations

import sys

from .base.errors import exit_if_interrupted
from .base.interrupts import terminate_as_interrupt
from .tracking import TrackingUnavailableError, resend


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(argv) not in (1, 2):
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    try:
        with terminate_as_interrupt():
            count = resend(argv[0], argv[1] if len(argv) == 2 else None)
    except TrackingUnavailableError as exc:
        print(f"ortflow: nothing sent: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM: one line (what was sent stays sent)
        exit_if_interrupted(exc, argv)
        raise
    print(f"ortflow: {count} metric points sent from {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
