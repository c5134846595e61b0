#!/bin/bash
# Submit a collect to a running Ray cluster's head (its dashboard port, 8265 by default).
# The job's driver runs with the head's environment: start the nodes from the venv that has
# rayrollout installed (or add `--runtime-env-json '{"pip": ["rayrollout"]}'`).
# Ray 2.60 heads use token authentication: clients need RAY_AUTH_MODE=token.
set -euo pipefail
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
ADDRESS=${ADDRESS:-http://127.0.0.1:8265}

ray job submit --address "$ADDRESS" --working-dir . -- \
    rayrollout collect rayrollout/environments/weather/tasks.jsonl --num-repeats 4 \
    --config cluster/examples/cluster.yaml

# Long-lived services instead: up once, collect (attaches) many times, down at the end.
ray job submit --address "$ADDRESS" --working-dir . -- rayrollout up --config cluster/examples/cluster.yaml
ray job submit --address "$ADDRESS" --working-dir . -- \
    rayrollout collect rayrollout/environments/weather/tasks.jsonl --config cluster/examples/cluster.yaml
ray job submit --address "$ADDRESS" -- rayrollout status --namespace rollouts-prod
ray job submit --address "$ADDRESS" -- rayrollout down --namespace rollouts-prod
