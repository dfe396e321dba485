"""`python -m stormtopo.operator`: run the operator (see app.py)."""

import sys

# The operator talks to the API with its own small client (stormtopo/kube). Our own code never imports
# the official client (an import-linter contract), and the image does not install it (the `cli` extra);
# but kopf imports it whenever it is installed, as in a development venv, for ~50 MB: keep it out.
sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]

# API reads run on threads (explanations in a process of their own, explainer.py); a thread holding the GIL delays the event loop that
# answers admissions by up to the switch interval (5 ms by default). Measured offline, an asyncio server
# beside a thread explaining 20 gangs: p99 18 ms at 5 ms, 4-6 ms at 0.5 ms (BENCHMARKS.md, admission).
sys.setswitchinterval(0.0005)

from stormtopo.operator.app import main  # noqa: E402  (must follow the lines above)

main()
