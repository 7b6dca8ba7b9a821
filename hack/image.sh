#!/usr/bin/env bash
# make image: builds deploy/Dockerfile with whichever builder works here.
#
#   hack/image.sh builder   names the builder: docker (only with an engine that
#                           answers, and buildx), podman or buildah; exits 1 if
#                           none works
#   hack/image.sh build     builds IMAGE
#
# build's environment (the Makefile's variables):
#   IMAGE          the tag
#   IMAGE_FROM     bin (default): the binaries in BIN, which `make build` made,
#                  through the build context "bin": no registry needed.
#                  source: built in the Dockerfile's Go image (pulled).
#   IMAGE_ARCHIVE  if set, also write the image there as an archive for
#                  `ctr images import` (OCI; docker's own format from docker)
#   IMAGE_BUILDER  docker, podman or buildah, instead of the first that works
#   BIN, VERSION
set -euo pipefail
cd "$(dirname "$0")/.."

builder() {
	if [ -n "${IMAGE_BUILDER:-}" ]; then
		echo "$IMAGE_BUILDER"
		return
	fi
	# `docker --version` answers from a client with no engine behind it:
	# `info` asks the engine. Docker builds with BuildKit, through buildx
	# (the legacy builder has no --build-context and no RUN --mount).
	if command -v docker >/dev/null && timeout 60 docker info >/dev/null 2>&1 &&
		docker buildx version >/dev/null 2>&1; then
		echo docker
		return
	fi
	if command -v podman >/dev/null && timeout 60 podman info >/dev/null 2>&1; then
		echo podman
		return
	fi
	if command -v buildah >/dev/null && buildah version >/dev/null 2>&1; then
		echo buildah
		return
	fi
	return 1
}

build() {
	local b
	if ! b=$(builder); then
		echo "image: no image builder works here (docker with an engine, podman or buildah): hack/deps.sh image installs buildah" >&2
		exit 1
	fi
	local args=(-f deploy/Dockerfile -t "$IMAGE" --build-arg "VERSION=$VERSION")
	case ${IMAGE_FROM:-bin} in
	bin)
		# The platform make build built for, which the image must say.
		local f platform
		for f in napitap napitapd napitap-fdstore napitapctl; do
			[ -x "$BIN/$f" ] || { echo "image: no $BIN/$f: make build makes it" >&2; exit 1; }
		done
		platform=$(go env GOOS)/$(go env GOARCH)
		args+=(--platform "$platform" --build-context "bin=$(cd "$BIN" && pwd)")
		;;
	source) ;;
	*)
		echo "image: IMAGE_FROM=$IMAGE_FROM: bin or source" >&2
		exit 2
		;;
	esac
	local cmd
	case $b in
	# BuildKit, for --build-context: `docker build` is buildx only from 23.0.
	docker) cmd=(docker buildx build --load) ;;
	podman) cmd=(podman build) ;;
	buildah) cmd=(buildah build) ;;
	*)
		echo "image: IMAGE_BUILDER=$b: docker, podman or buildah" >&2
		exit 2
		;;
	esac
	local old
	old=$("$b" images -q "$IMAGE" 2>/dev/null | head -1) || true
	echo "${cmd[*]} ${args[*]} ."
	"${cmd[@]}" "${args[@]}" .
	# The image this tag named before is left with no name: remove it, so
	# that rebuilds do not pile up (rmi refuses one that has other names).
	if [ -n "$old" ] && [ "$old" != "$("$b" images -q "$IMAGE" | head -1)" ]; then
		"$b" rmi "$old" >/dev/null 2>&1 || true
	fi

	if [ -n "${IMAGE_ARCHIVE:-}" ]; then
		mkdir -p "$(dirname "$IMAGE_ARCHIVE")"
		rm -f "$IMAGE_ARCHIVE"
		case $b in
		buildah) buildah push -q "$IMAGE" "oci-archive:$IMAGE_ARCHIVE:$IMAGE" ;;
		podman) podman save -q --format oci-archive -o "$IMAGE_ARCHIVE" "$IMAGE" ;;
		# docker's own archive, which ctr imports too (OCI layout as well
		# from docker 25).
		docker) docker save -o "$IMAGE_ARCHIVE" "$IMAGE" ;;
		esac
	fi
	echo "image: $IMAGE, built by $b: $("$b" images --format '{{.Size}}' "$IMAGE" | head -1) uncompressed"
	if [ -n "${IMAGE_ARCHIVE:-}" ]; then
		echo "image: $IMAGE_ARCHIVE: $(stat -c %s "$IMAGE_ARCHIVE") bytes; on a node: ctr -n k8s.io images import $IMAGE_ARCHIVE"
	fi
}

case ${1:-} in
builder)
	builder
	;;
build)
	build
	;;
*)
	echo "usage: $0 builder|build" >&2
	exit 2
	;;
esac
