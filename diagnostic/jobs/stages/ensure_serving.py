"""The step every pipeline stage takes first: making sure the lab serves the customer's
configuration before anything is measured on it."""

from __future__ import annotations

from typing import Any

from diagnostic.jobs.stage_context import StageContext

# A configuration that is not serving (the stage is a retry on a fresh worker, the engine
# died since reproduce, or another job used the lab meanwhile) is started again warm: the
# cold start was reproduce's job.
RELAUNCH_TIMEOUT_LAB_S = 3600.0


def ensure_serving(ctx: StageContext, config: dict[str, Any] | None = None) -> None:
    """Make sure the engine we measure runs `config` (the stage's configuration by default).

    A healthy /health is not enough: after another job used the lab, the engine answering
    may run a different configuration. The nodes say which launch spec their engine was
    started from; anything but this configuration's specs is stopped and ours relaunched.
    """
    session = ctx.session
    config = ctx.config if config is None else config
    state = session.serving_state(config)
    if state.serving:
        return
    why = ("a different configuration is serving" if state.other_configuration
           else "the configuration is not serving")
    ctx.log(f"{why} ({state.reason}); stopping whatever runs and starting ours again (warm)")
    ctx.progress(2, f"{why}; starting it again (warm)")
    session.launch(config, cold=False, timeout_s=RELAUNCH_TIMEOUT_LAB_S)
