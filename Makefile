# napitap: NAPI multiqueue taps for VM pods.
# sudo's secure_path drops /usr/local/go/bin, where Go's tarball puts go:
# look there when go is not on PATH, so `sudo make demo` works as written.
# Exported, for the tests that run `go build` themselves.
ifeq ($(shell command -v go 2>/dev/null),)
export PATH := $(PATH):/usr/local/go/bin
GO        ?= /usr/local/go/bin/go
endif
GO        ?= go
BIN       := bin
# RELEASE is the release this tree is (the VERSION file), whose tag the
# deploy manifests name; VERSION is what the binaries report: git describe's
# in a checkout, or VERSION=vX.Y.Z for make release.
RELEASE   := $(shell cat VERSION)
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo $(RELEASE))
LDFLAGS   := -s -w -X github.com/napitap/napitap/pkg/buildinfo.version=$(VERSION)
# Reference plugins and cnitool, built from the Go module proxy at the
# versions go.mod pins (the `tool` block); never vendored.
TOOLS     := github.com/containernetworking/plugins/plugins/main/bridge \
             github.com/containernetworking/plugins/plugins/main/ptp \
             github.com/containernetworking/plugins/plugins/ipam/host-local \
             github.com/containernetworking/cni/cnitool
TEST_TIMEOUT ?= 20m

# The image `make image` builds and `make deploy-manifests` deploys. By
# default the one deploy/base/kustomization.yaml names, so that `make image`
# builds what `kubectl apply -k deploy/` runs (deploy/test checks that they
# agree). For another: make image deploy-manifests IMAGE=REGISTRY/napitap:TAG
IMAGE     ?= ghcr.io/napitap/napitap:$(RELEASE)
# Where deploy-manifests writes DEPLOY rendered with IMAGE (not tracked).
# DEPLOY: deploy, or an overlay such as deploy/overlays/nonroot-vmm, or
# deploy/examples (its pod runs napitapctl from the same image).
MANIFESTS ?= $(BIN)/napitap.yaml
DEPLOY    ?= deploy

# Every package but the real-node e2e, which builds Kubernetes first
# (make e2e-node), the kind suite, which needs run.sh's cluster (make
# e2e-kind), and the other kernel's (make test-kernel).
NOT_UNIT   = -e /test/e2e/node -e /test/e2e/kind/suite -e /test/e2e/kernel
PKGS       = $(shell $(GO) list ./... | grep -v $(NOT_UNIT))
E2E_PKGS   = $(shell $(GO) list ./test/e2e/... | grep -v $(NOT_UNIT))

.PHONY: all deps deps-demo deps-test deps-image deps-kind deps-kubevirt deps-kernel test-kernel build tools demo test test-arm64 unit deploy-test e2e e2e-node e2e-kind kind-node-image kind-cluster kubevirt-images image print-image deploy-manifests release lint-workflows fuzz-short bench clean

all: build

# The programs each target calls, checked first; their Debian packages are
# installed only if missing (and only where apt-get exists). deps-demo: ip
# and tc. deps-test: QEMU, busybox-static, containerd, runc, crun, libvirt,
# an image builder, ... deps-image: an image builder.
deps: deps-test
deps-demo:
	./hack/deps.sh demo
deps-test:
	./hack/deps.sh test
deps-image:
	./hack/deps.sh image
deps-kind:
	./hack/deps.sh kind
deps-kubevirt:
	./hack/deps.sh kubevirt
deps-kernel:
	./hack/deps.sh kernel

# The four binaries every image and release holds, static.
BINARIES  := ./plugins/napitap ./cmd/napitapd ./cmd/napitap-fdstore ./cmd/napitapctl
# The platforms make image and make release build for: one manifest list,
# one set of binaries each. This machine's land in $(BIN)/, the others' in
# $(BIN)/linux-ARCH/ (make build-ARCH).
PLATFORMS ?= linux/amd64,linux/arm64
comma     := ,
HOST_ARCH := $(shell $(GO) env GOARCH)
ARCHES     = $(patsubst linux/%,%,$(subst $(comma), ,$(PLATFORMS)))
CROSS_ARCHES = $(filter-out $(HOST_ARCH),$(ARCHES))

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ $(BINARIES)

build-%:
	CGO_ENABLED=0 GOOS=linux GOARCH=$* $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/linux-$*/ $(BINARIES)

tools:
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ $(TOOLS)

# The main job: bridge + napitap on a throwaway pod netns, via cnitool.
demo: deps-demo build tools
	./hack/demo.sh

# Everything, privileged tests and the QEMU e2e included (run as root;
# CI=true makes a test that cannot run fail instead of skip). The guest
# kernel and initramfs are cached under .cache/vm.
test: deps-test build tools
	$(GO) vet ./...
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(PKGS)
	$(MAKE) deploy-test
	$(MAKE) lint-workflows
	$(MAKE) test-arm64
	$(MAKE) test-kernel

# arm64: the four binaries cross-built, run under qemu-user, and the tests
# that need no kernel objects (netns, taps, seccomp, which qemu-user does
# not emulate) run through it: the config, the seccomp profiles as a node
# of that arch renders them (their architectures, KubeVirt's parity), and
# the agent's filter as built for arm64 (hack/deps.sh test installs
# qemu-user-static).
ARM64_PKGS  = ./pkg/config ./pkg/buildinfo ./pkg/katadan ./pkg/seccompprofile
ARM64_TESTS = '^(TestTheFilterNotifiesOnlyANativeTUNSETIFFOnEveryArch|TestTheArchTableAgreesWithThisBuild)$$'
test-arm64: deps-test build-arm64
	for b in napitapd napitap-fdstore napitapctl; do qemu-aarch64-static $(BIN)/linux-arm64/$$b --version; done
	CGO_ENABLED=0 GOARCH=arm64 $(GO) test -count=1 -exec qemu-aarch64-static $(ARM64_PKGS)
	CGO_ENABLED=0 GOARCH=arm64 $(GO) test -count=1 -exec qemu-aarch64-static -run $(ARM64_TESTS) ./pkg/seccompagent

# .github/workflows, checked as GitHub would run them.
ACTIONLINT ?= github.com/rhysd/actionlint/cmd/actionlint@v1.7.12
lint-workflows:
	$(GO) run $(ACTIONLINT)

# Every manifest under deploy/, rendered with kustomize and strictly decoded
# (a nested module, so the Kubernetes libraries stay out of the plugin's),
# and, as root, `make image`'s archive imported into a containerd of its own.
# deploy/test/kubevirt decodes the KubeVirt ones into kubevirt.io/api's types
# twice: at the newest release (go.mod) and the oldest the KubeVirt README
# claims (oldest.mod); deploy/test/containerd decodes the Kata containerd
# snippets with containerd 1.7's and 2.0's own config types.
deploy-test:
	cd deploy/test && $(GO) vet ./... && $(GO) test -count=1 ./...
	cd deploy/test/kubevirt && $(GO) vet ./... && $(GO) test -count=1 ./... && \
		$(GO) vet -modfile=oldest.mod ./... && $(GO) test -count=1 -modfile=oldest.mod ./...
	cd deploy/test/containerd && $(GO) vet ./... && $(GO) test -count=1 ./...

# The end-to-end suites alone: a QEMU guest, containerd + crictl, Multus-style
# delegation, faults and churn.
e2e: deps-test build tools
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) $(E2E_PKGS)

# A real node: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# containerd, kubelet and Multus built from the Go module proxy (cached in
# .cache/k8s-* and .cache/multus-*; the first build takes minutes), running
# the shipped NADs through Multus and the shipped DaemonSet (kubectl apply -k
# deploy/) from the image make image builds, which the test imports.
e2e-node: deps-test deps-image build tools
	$(GO) test -count=1 -v -timeout 40m ./test/e2e/node/

# kind, Multus and the DaemonSet, offline: three nodes of the node image
# below, a pod on each worker (test/e2e/kind/run.sh); root and a Docker engine.
e2e-kind: deps-kind deps-kubevirt
	./test/e2e/kind/run.sh

# The kind node image, built offline into .cache/kind (test/e2e/kind/nodeimage.sh).
kind-node-image:
	./test/e2e/kind/nodeimage.sh

# KubeVirt v1.7.0's images (docker-archives for kind load image-archive) and
# its operator and CR manifests, built offline into .cache/kubevirt-v1.7.0
# (test/e2e/kind/kubevirt/images.sh).
kubevirt-images: deps-kubevirt
	./test/e2e/kind/kubevirt/images.sh

# A kind cluster of that image, privileged or through the docker wrapper
# (test/e2e/kind/cluster.sh; KIND_WORKERS=2 for three nodes).
kind-cluster: kind-node-image
	./test/e2e/kind/cluster.sh create

# deploy/Dockerfile, built by the first builder that works here: docker with
# an engine behind it, podman, buildah (hack/deps.sh image installs buildah
# where none does). From the binaries `make build` made, through the build
# context "bin": no registry needed, and the image runs what the tests ran.
# One image per platform of PLATFORMS, under one manifest list named
# IMAGE. IMAGE_FROM=source compiles them in the Dockerfile's Go image
# instead (pulled); IMAGE_ARCHIVE=PATH also writes an OCI archive of the
# list for `ctr images import`; IMAGE_BUILDER=docker|podman|buildah picks
# the builder.
IMAGE_FROM    ?= bin
IMAGE_ARCHIVE ?=
IMAGE_BUILDER ?=
image: deps-image $(if $(filter bin,$(IMAGE_FROM)),build $(addprefix build-,$(CROSS_ARCHES)))
	IMAGE='$(IMAGE)' IMAGE_FROM='$(IMAGE_FROM)' IMAGE_ARCHIVE='$(IMAGE_ARCHIVE)' PLATFORMS='$(PLATFORMS)' \
		IMAGE_BUILDER='$(IMAGE_BUILDER)' BIN='$(BIN)' VERSION='$(VERSION)' ./hack/image.sh build

print-image:
	@echo $(IMAGE)

# DEPLOY rendered with kustomize's image override to IMAGE, into MANIFESTS:
# kubectl apply -f $(MANIFESTS). Edits no tracked file.
deploy-manifests:
	@mkdir -p $(dir $(MANIFESTS))
	cd deploy/test && $(GO) run ./cmd/render-deploy --image '$(IMAGE)' --dir '$(abspath $(DEPLOY))' -o '$(abspath $(MANIFESTS))'
	@echo "$(MANIFESTS): $(DEPLOY) with image $(IMAGE); kubectl apply -f $(MANIFESTS)"

# A release under release/VERSION/: the image as an OCI archive tagged
# ghcr.io/napitap/napitap:VERSION, deploy/ and its overlays rendered with
# that tag, the four static binaries (reporting VERSION) of each platform
# as napitap-linux-ARCH-VERSION.tgz, and SHA256SUMS.
# VERSION=vX.Y.Z, the VERSION file's, which the tracked manifests name.
RELEASE_DIR = release/$(VERSION)
RELEASE_IMAGE = ghcr.io/napitap/napitap:$(VERSION)
release:
	@case '$(VERSION)' in v[0-9]*.[0-9]*.[0-9]*) ;; *) echo "make release: VERSION=vX.Y.Z, not '$(VERSION)'" >&2; exit 2;; esac
	@[ '$(VERSION)' = '$(RELEASE)' ] || { echo "make release: VERSION=$(VERSION), but the VERSION file and the manifests say $(RELEASE)" >&2; exit 2; }
	rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)
	$(MAKE) image IMAGE=$(RELEASE_IMAGE) IMAGE_ARCHIVE=$(abspath $(RELEASE_DIR))/napitap-image-$(VERSION).tar
	$(MAKE) deploy-manifests IMAGE=$(RELEASE_IMAGE) MANIFESTS=$(RELEASE_DIR)/napitap.yaml
	$(MAKE) deploy-manifests IMAGE=$(RELEASE_IMAGE) DEPLOY=deploy/overlays/kata MANIFESTS=$(RELEASE_DIR)/napitap-kata.yaml
	$(MAKE) deploy-manifests IMAGE=$(RELEASE_IMAGE) DEPLOY=deploy/overlays/nonroot-vmm MANIFESTS=$(RELEASE_DIR)/napitap-nonroot-vmm.yaml
	for a in $(ARCHES); do d=$(BIN); [ $$a = $(HOST_ARCH) ] || d=$(BIN)/linux-$$a; \
		tar -C $$d --owner=0 --group=0 -czf $(RELEASE_DIR)/napitap-linux-$$a-$(VERSION).tgz napitap napitapd napitap-fdstore napitapctl || exit 1; done
	cd $(RELEASE_DIR) && sha256sum * > SHA256SUMS
	@ls -l $(RELEASE_DIR)

# Each fuzz target for a bounded number of inputs (CI); FUZZTIME=10m for long
# runs. A count, not a duration: Go 1.26's coordinator can report its own
# -fuzztime deadline as a failure (go.dev/issue/75804, fixed in Go 1.27).
FUZZTIME ?= 1000000x
fuzz-short:
	$(GO) test ./pkg/config/ -run '^$$' -fuzz FuzzLoad -fuzztime $(FUZZTIME)
	$(GO) test ./pkg/handoff/ -run '^$$' -fuzz FuzzDecodeRequest -fuzztime $(FUZZTIME)

# The kernel-facing packages' tests, the plugin's, napitapd's and the demo
# in a Debian 12 guest (Linux 6.1) under QEMU TCG, its root filesystem
# built once into .cache/kernel (test/e2e/kernel/README.md); the last step
# of make test (5-10 minutes).
# KERNEL_PKGS="pkg/peer pkg/tunperm" runs a few; KERNEL_RUN=REGEXP a few tests.
KERNEL_PKGS ?=
KERNEL_RUN  ?=
test-kernel: deps-kernel
	NAPITAP_TEST_KERNEL=1 NAPITAP_KERNEL_PKGS="$(KERNEL_PKGS)" NAPITAP_KERNEL_RUN="$(KERNEL_RUN)" \
		$(GO) test -count=1 -v -timeout 150m -run '^TestKernel$$' ./test/e2e/kernel/

# Tests that need no root.
unit:
	$(GO) test -count=1 ./pkg/config/...

# Control and data plane side by side with their baselines; writes
# docs/bench/*.md and plots. Run it on an idle machine. The data path runs
# three ways (guest to host; host to guest and round trips; more flows than
# CPUs and threaded NAPI at scale), merged into one report.
bench: build tools
	$(GO) test -run '^$$' -bench . -benchtime 200x ./plugins/napitap/
	$(GO) run ./cmd/napitap-bench cni --out docs/bench
	$(GO) run ./cmd/napitap-bench capacity --pods 1,10,50,110 --out docs/bench
	$(GO) run ./cmd/napitap-bench datapath --out $(BIN)/bench/g2h
	$(GO) run ./cmd/napitap-bench datapath --sizes h2g-udp64,h2g-tcp,rr64 --queues 1,4 \
		--modes plain,plain+noqueue,napi,napi+noqueue,threaded,threaded+noqueue --out $(BIN)/bench/h2g
	$(GO) run ./cmd/napitap-bench datapath --sizes udp64,tcp1448 --queues 8 --modes plain,napi,threaded \
		--runs 3 --scale-taps 110 --out $(BIN)/bench/scale
	$(GO) run ./cmd/napitap-bench datapath --out docs/bench \
		--from-json $(BIN)/bench/g2h/datapath.json,$(BIN)/bench/h2g/datapath.json,$(BIN)/bench/scale/datapath.json
	$(GO) test -run '^$$' -bench TUNSETIFF -benchtime 2000x ./pkg/seccompagent/
	$(GO) test -run '^$$' -bench LookupDuringSweep -benchtime 20x ./pkg/handoff/
	$(GO) test -run '^$$' -bench 'Takeover|CrashRestart' -benchtime 20x ./cmd/napitapd/

clean:
	rm -rf $(BIN) release
