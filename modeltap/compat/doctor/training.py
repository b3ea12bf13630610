"""The rule on the training loss (decoupled-loss): decoupled PPO on behaviour log-probs recorded
through the agent proxy.

Owns: that rule. Does not own: the trainer's memory settings (gpu.py) or its micro-batches (limits.py).
"""

from __future__ import annotations

from modeltap.compat.doctor.context import Context, Finding, override


def decoupled_loss(ctx: Context) -> list[Finding]:
    """Decoupled PPO loss on behaviour log-probs recorded through the agent proxy.

    Decoupled PPO weights every token by pi_prox/pi_behave, with pi_behave the log-probs AReaL's proxy
    recorded while the agent ran (docs/areal.md §1.1.6, §4.3; AReaL's PPOActorConfig.use_decoupled_loss,
    rejection_sampling)."""
    if not ctx.uses_agent_proxy or ctx.config.get("actor.use_decoupled_loss") is not True:
        return []
    unfiltered = ctx.config.get("actor.rejection_sampling") is None
    why = (
        "Through the proxy the behaviour log-probs are whatever the agent's requests produced: the agent "
        "picks its own temperature and top_p (AReaL only fills in 1.0 when they are missing) while the "
        "trainer recomputes at actor.temperature, and a weight update in mid-completion makes one "
        "completion span several policy versions. Both skew the importance weight"
        + (", and with rejection_sampling unset nothing bounds it." if unfiltered else ".")
        + " The fix trains on log-probs the trainer recomputes. To keep the decoupled loss instead, make "
        "every agent send temperature = actor.temperature and set actor.rejection_sampling to "
        "{level: token, action: mask, metric: ratio, upper: 5.0}."
    )
    fix = " ".join([override("actor.use_decoupled_loss", False), override("actor.recompute_logprob", True)])
    title = "decoupled loss on behaviour log-probs recorded through the agent proxy"
    return [Finding("warning", "actor.use_decoupled_loss", title, why, fix)]
