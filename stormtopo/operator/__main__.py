"""`python -m stormtopo.operator`: run the operator (see app.py)."""

import sys

# The operator talks to the API with its own small client (stormtopo/kube). Our own code never imports
# the official client (an import-linter contract), and the image does not install it (the `cli` extra);
# but kopf imports it whenever it is installed, as in a development venv, for ~50 MB: keep it out.
sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]

from stormtopo.operator.app import main  # noqa: E402  (must follow the line above)

main()
