#!/usr/bin/env bash
# make image: builds deploy/Dockerfile with whichever builder works here.
#
#   hack/image.sh builder   names the builder: docker (only with an engine that
#                           answers, and buildx), podman or buildah; exits 1 if
#                           none works
#   hack/image.sh build     builds IMAGE: a manifest list of one image per
#                           platform of PLATFORMS
#   hack/image.sh rm REF    removes REF from the builder's store, a list with
#                           its images (`buildah rmi` refuses a list)
#
# build's environment (the Makefile's variables):
#   IMAGE          the tag
#   PLATFORMS      linux/amd64,linux/arm64 (comma-separated; default: this
#                  machine's)
#   IMAGE_FROM     bin (default): the binaries `make build` put in BIN (this
#                  machine's platform) and `make build-ARCH` in BIN/linux-ARCH,
#                  through the build context "bin": no registry needed.
#                  source: built in the Dockerfile's Go image (pulled).
#   IMAGE_ARCHIVE  if set, also write the list there as an OCI archive for
#                  `ctr images import` (docker's own format, of one platform,
#                  from docker)
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

# remove REF, as build leaves it: a manifest list and the images it names,
# or an image. Quiet if there is none.
remove() {
	local b=$1 ref=$2 digests id digest
	if digests=$("$b" manifest inspect "$ref" 2>/dev/null | sed -n 's/.*"digest": *"\(sha256:[0-9a-f]*\)".*/\1/p'); then
		"$b" manifest rm "$ref" >/dev/null
		# The images of the list have no name: find them by digest.
		while read -r id digest; do
			if grep -qx "$digest" <<<"$digests"; then
				"$b" rmi "$id" >/dev/null 2>&1 || true
			fi
		done < <("$b" images --no-trunc --format '{{.ID}} {{.Digest}}')
	elif [ -n "$("$b" images -q "$ref" 2>/dev/null)" ]; then
		"$b" rmi "$ref" >/dev/null 2>&1 || true
	fi
}

build() {
	local b
	if ! b=$(builder); then
		echo "image: no image builder works here (docker with an engine, podman or buildah): hack/deps.sh image installs buildah" >&2
		exit 1
	fi
	local host platforms
	host=linux/$(go env GOARCH)
	IFS=, read -ra platforms <<<"${PLATFORMS:-$host}"
	if [ "$b" = docker ] && [ "${#platforms[@]}" -gt 1 ]; then
		# docker's own image store keeps one platform under a tag.
		echo "image: docker's image store holds one platform per tag: building $host alone (buildah or podman build every platform of PLATFORMS=${PLATFORMS})" >&2
		platforms=("$host")
	fi
	local list
	list=$(IFS=,; echo "${platforms[*]}")
	local args=(-f deploy/Dockerfile --platform "$list" --build-arg "VERSION=$VERSION")
	case ${IMAGE_FROM:-bin} in
	bin)
		# Each platform's binaries under OS-ARCH/ of a context of their
		# own, linked (not copied) from where make build-ARCH put them.
		local p dir f
		# Global: the trap runs after build has returned.
		ctx=$(mktemp -d "$BIN/.image-context.XXXXXX")
		trap 'rm -rf "$ctx"' EXIT
		for p in "${platforms[@]}"; do
			dir=$BIN
			[ "$p" = "$host" ] || dir=$BIN/${p%%/*}-${p#*/}
			mkdir -p "$ctx/${p%%/*}-${p#*/}"
			for f in napitap napitapd napitap-fdstore napitapctl; do
				[ -x "$dir/$f" ] || { echo "image: no $dir/$f for $p: make build (this machine's platform) or make build-${p#*/} makes it" >&2; exit 1; }
				ln "$dir/$f" "$ctx/${p%%/*}-${p#*/}/$f" 2>/dev/null || cp "$dir/$f" "$ctx/${p%%/*}-${p#*/}/$f"
			done
		done
		args+=(--build-context "bin=$ctx")
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
	docker) cmd=(docker buildx build --load -t "$IMAGE") ;;
	# One image per platform, under a manifest list named IMAGE.
	podman) cmd=(podman build --manifest "$IMAGE") ;;
	buildah) cmd=(buildah build --manifest "$IMAGE") ;;
	*)
		echo "image: IMAGE_BUILDER=$b: docker, podman or buildah" >&2
		exit 2
		;;
	esac
	# What this tag named before goes, so that rebuilds neither pile up
	# nor add to the old list.
	if [ "$b" = docker ]; then
		local old
		old=$(docker images -q "$IMAGE" 2>/dev/null | head -1) || true
	else
		remove "$b" "$IMAGE"
	fi
	echo "${cmd[*]} ${args[*]} ."
	"${cmd[@]}" "${args[@]}" .
	if [ "$b" = docker ] && [ -n "$old" ] && [ "$old" != "$(docker images -q "$IMAGE" | head -1)" ]; then
		docker rmi "$old" >/dev/null 2>&1 || true
	fi

	if [ -n "${IMAGE_ARCHIVE:-}" ]; then
		mkdir -p "$(dirname "$IMAGE_ARCHIVE")"
		rm -f "$IMAGE_ARCHIVE"
		case $b in
		buildah | podman) "$b" manifest push -q --all --format oci "$IMAGE" "oci-archive:$IMAGE_ARCHIVE:$IMAGE" ;;
		# docker's own archive, which ctr imports too (OCI layout as well
		# from docker 25).
		docker) docker save -o "$IMAGE_ARCHIVE" "$IMAGE" ;;
		esac
	fi
	if [ "$b" = docker ]; then
		echo "image: $IMAGE ($list), built by docker: $(docker images --format '{{.Size}}' "$IMAGE" | head -1) uncompressed"
	else
		local digest size
		while read -r p digest; do
			size=$("$b" images --no-trunc --format '{{.Digest}} {{.Size}}' | awk -v d="$digest" '$1 == d { print $2, $3; exit }')
			echo "image: $IMAGE linux/$p, built by $b: $size uncompressed"
		done < <("$b" manifest inspect "$IMAGE" | awk -F'"' '$2 == "digest" { d = $4 } $2 == "architecture" { print $4, d }' | sort)
	fi
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
rm)
	[ $# -eq 2 ] || { echo "usage: $0 rm REF" >&2; exit 2; }
	b=$(builder) || exit 0
	remove "$b" "$2"
	;;
*)
	echo "usage: $0 builder|build|rm REF" >&2
	exit 2
	;;
esac
