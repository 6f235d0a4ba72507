#!/usr/bin/env bash
# Writes the generated references (docs/reference/router-config-fields.md,
# metrics.md, cli.md) from the code: the config types, the registry's help
# text and the argument parser. The test
# ext-proc/tests/reference_docs.rs fails when they are stale.
set -euo pipefail
cd "$(dirname "$0")/.."
UPDATE_REFERENCE=1 cargo test -q -p fleetroute --test reference_docs
echo "docs/reference/router-config-fields.md, metrics.md and cli.md written"
