"""`python -m stormtopo.operator`: run the operator (see app.py)."""

import sys

# The operator talks to the API with its own small client (operator/kube.py). kopf imports the
# official client whenever it is installed, for ~50 MB the operator never uses: keep it out.
sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]

from stormtopo.operator.app import main  # noqa: E402  (must follow the line above)

main()
