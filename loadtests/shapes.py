"""Load shapes, picked with `--shape step|spike` when this file is added with `-f`.

step: the users arrive in `--shape-steps` equal steps over `--run-time`.
spike: a disconnect storm. A quarter of the users (MixedUser) for the first third of the run,
then all `--users` as StormUser (every request disconnects) for the second third, then the
quarter of MixedUser again, to see whether latency recovers once the storm is over.
"""

from __future__ import annotations

from locust import LoadTestShape

from loadtests.plans import spike_plan, step_plan


class OptionShape(LoadTestShape):
    use_common_options = True

    def tick(self):
        o = self.runner.environment.parsed_options
        t, users, rate, duration = self.get_run_time(), o.num_users, o.spawn_rate, o.run_time
        if o.shape == "step":
            plan = step_plan(t, users, rate, max(1, o.shape_steps), duration)
        elif o.shape == "spike":
            plan = spike_plan(t, users, rate, duration)
        else:
            plan = (users, rate, None) if t < duration else None
        if plan is None:
            return None
        n, r, names = plan
        if names is None:
            return n, r
        classes = {c.__name__: c for c in self.runner.user_classes}
        return n, r, [classes[name] for name in names]
