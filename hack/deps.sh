#!/usr/bin/env bash
# Installs the Debian packages napitap's demo and tests need, if missing.
set -euo pipefail
missing=()
command -v ip >/dev/null || missing+=(iproute2)
command -v tc >/dev/null || missing+=(iproute2)
command -v make >/dev/null || missing+=(make)
if [ ${#missing[@]} -gt 0 ]; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v go >/dev/null || { echo "Go 1.26+ must be on PATH (e.g. /usr/local/go/bin)" >&2; exit 1; }
