# crius: two commands on a fresh Debian 12 machine, as root.
#   make run   installs what crius needs, builds release, starts crius in the foreground
#   make test  installs what the tests need, builds, runs every test
# Also: make unit (the tests that need neither root nor containers; building needs the
#       packages `make deps-run` installs), make e2e (the integration and end-to-end tests
#       only, as root), make lint (fmt, clippy, rustdoc), make install (binaries, systemd unit,
#       config, a CNI network if none), make deb (a Debian package of the same),
#       make test-node (crius's package in the node VM, contrib/node-vm: Debian 13 under qemu),
#       make node-e2e NODE_E2E_HARNESS=DIR (Kubernetes' node e2e suite against a fresh crius),
#       make bench [BENCH_ENDPOINT=unix://... CRITEST=...] (the performance figures and ratios).

CARGO ?= cargo
# Debian packages crius or its tests use at run time.
#  libseccomp-dev, pkg-config: seccomp filters through libcontainer
#  containernetworking-plugins: CNI plugins (/usr/lib/cni) for pod networks
#  iptables, iproute2: used by the bridge and portmap plugins and by the tests
#  docker-registry, busybox-static, apache2-utils, openssl: the local registry, test images,
#  htpasswd, test TLS certificates
#  python3-venv: the Python gRPC client of the tests (.ci/install-python-deps)
#  runc, crun, runsc: the OCI runtimes of the RuntimeClass handler tests (crun refuses a hybrid
#  cgroup node whose cgroup2 hierarchy holds a controller: contrib/cgroup/hybrid-v1-only moves
#  such controllers to v1 hierarchies of their own)
#  criu: checkpoint and restore (CheckpointContainer); on kernels Debian 12's criu 3.17 does not
#  know (Linux 6.13+), contrib/criu/install adds Debian 13's criu 4.1 under /opt/crius/criu
#  tinyproxy: the local HTTP/CONNECT proxy of the registry proxy tests
#  containerd: `ctr`, the import benchmark's comparison and the --from-containerd source
RUN_PACKAGES  := libseccomp-dev pkg-config containernetworking-plugins iptables iproute2 criu
TEST_PACKAGES := $(RUN_PACKAGES) docker-registry busybox-static apache2-utils openssl systemd \
                 python3-venv runc crun runsc tinyproxy containerd

.PHONY: run test unit e2e build build-debug build-release install deb cargo-deb cargo-deny deps-run deps-test \
        check-rust lint test-node bench bench-node node-vm-deps node-vm-image node-vm-deb node-e2e soak

# `make install`: where things go (DESTDIR is prepended to every path, for packaging).
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system
CNICONFDIR ?= $(SYSCONFDIR)/cni/net.d
# Which build to install: release (default) or debug.
PROFILE    ?= release

run: deps-run build-release
	./target/$(HOST_TRIPLE)/release/crius

# The long-lived crius-shim (one per pod) and the short-lived crius-shim-helper (one per create
# and exec) are linked statically, glibc and libseccomp included: no ld.so and libc.so pages in
# every shim, nothing for the loader to do at each helper's exec (docs/performance.md,
# "Static binaries"). So is the daemon: 850 KiB less resident than with libc.so.6 mapped
# whole. They are built for an explicit --target, the host's: cargo then applies RUSTFLAGS to
# them and their dependencies only, not to build scripts and proc macros (which must stay
# dynamic). A plain `cargo build` still makes dynamic ones in target/<profile>/; `make build`
# and the tests use the static ones, what is installed. `=`, not `:=`: rustc may only exist once check-rust has
# run.
HOST_TRIPLE = $(shell rustc -vV | sed -n 's/^host: //p')
# The caller's RUSTFLAGS without the static flag: the tests inherit the RUSTFLAGS STATIC_ENV
# gave `cargo test`, and the make runs of the install test must not add the flag a second
# time, which would be other flags and a rebuild of everything.
BASE_RUSTFLAGS = $(strip $(subst -C target-feature=+crt-static,,$(RUSTFLAGS)))
STATIC_ENV  = RUSTFLAGS="$(BASE_RUSTFLAGS) -C target-feature=+crt-static" LIBSECCOMP_LINK_TYPE=static \
              LIBSECCOMP_LIB_PATH="$$(pkg-config --variable=libdir libseccomp)"
STATIC_SHIM = $(STATIC_ENV) $(CARGO) build --target $(HOST_TRIPLE) -p crius-shim \
              --bin crius-shim --bin crius-shim-helper
CRIUS_BUILD = $(CARGO) build --target $(HOST_TRIPLE) -p crius --bin crius
# The debug build is one cargo run: the tests and every binary of the workspace, static, for
# the host triple. The tests run the crius, crius-shim and crius-shim-helper it leaves in
# target/<host-triple>/debug, which `make install PROFILE=debug` installs. One feature
# resolution for all (the tests' dev-dependencies add features to tokio and others) means one
# build of the dependencies. It was a dynamic build, the two static ones and the tests' build,
# which built most of them three times: 9.8 minutes after clippy on a fresh 2-core machine,
# against 5 to 5.7 now.
TEST_CARGO  = $(STATIC_ENV) $(CARGO) test --workspace --target $(HOST_TRIPLE)
TEST_ENV    = CRIUS_BIN=$(CURDIR)/target/$(HOST_TRIPLE)/debug/crius \
              CRIUS_SHIM_BIN=$(CURDIR)/target/$(HOST_TRIPLE)/debug/crius-shim

# Lint first: formatting fails in a second, before any build. The node VM's smoke (node_vm.rs)
# runs with the others: the debug build's package in the cached guest image.
# Afterwards the node's / and /root hold nothing new (.ci/nothing-new): tests write in their own
# temp dirs only.
NOTHING_NEW = ./.ci/nothing-new / /root -- env
test: deps-test node-vm-deps lint build node-vm-image node-vm-deb
	$(NOTHING_NEW) CRIUS_NODE_DEB=$(CURDIR)/$(DEBUG_DEB) $(TEST_ENV) $(TEST_CARGO) --no-fail-fast

# Unit tests of every crate and the shim's state machine against a fake launcher: no root, no
# containers, no network. Tests that need root say "skipped ...: needs root" and return.
unit: check-rust
	$(CARGO) test --workspace --lib --bins
	$(CARGO) test -p crius-shim --test state_machine

# The integration and end-to-end tests (tests/, shim/tests/, image/tests/, ...): as root.
e2e: deps-test build
	$(NOTHING_NEW) $(TEST_ENV) $(TEST_CARGO) --no-fail-fast --test '*'

build: check-rust
	$(TEST_CARGO) --no-run

# crius finds crius-shim beside itself: the release-shim builds are linked in next to it. Only
# the three installed binaries are built: a dynamic release build of the rest would be a second
# LTO link of the daemon for nothing.
build-release: check-rust
	$(STATIC_SHIM) --profile release-shim
	$(STATIC_ENV) $(CRIUS_BUILD) --release
	ln -f target/$(HOST_TRIPLE)/release-shim/crius-shim target/$(HOST_TRIPLE)/release-shim/crius-shim-helper \
	  target/$(HOST_TRIPLE)/release/

build-debug: build

# The binaries (crius finds crius-shim beside itself, the shim its helper; crius-pause is not
# installed: the shim carries a static build of it, which crius writes to <state>/bin at start),
# the systemd unit, a commented config (never over an existing one), and a single-node bridge
# network only when the CNI config dir has no network yet.
# All three are static builds (see STATIC_SHIM above); a release install takes the shim and its
# helper from the release-shim profile (Cargo.toml).
CRIUS_DIR = target/$(HOST_TRIPLE)/$(PROFILE)
SHIM_DIR = target/$(HOST_TRIPLE)/$(if $(filter release,$(PROFILE)),release-shim,$(PROFILE))
install: build-$(PROFILE)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/crius \
	  $(DESTDIR)$(CNICONFDIR)
	install -m 0755 $(CRIUS_DIR)/crius $(SHIM_DIR)/crius-shim $(SHIM_DIR)/crius-shim-helper \
	  $(DESTDIR)$(BINDIR)/
	sed 's|@BINDIR@|$(BINDIR)|g' contrib/systemd/crius.service > $(DESTDIR)$(UNITDIR)/crius.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/crius.service
	[ -e $(DESTDIR)$(SYSCONFDIR)/crius/config.toml ] || \
	  $(CRIUS_DIR)/crius config default > $(DESTDIR)$(SYSCONFDIR)/crius/config.toml
	if ! ls $(DESTDIR)$(CNICONFDIR) | grep -Eq '\.(conf|conflist|json)$$'; then \
	  install -m 0644 contrib/cni/10-crius-bridge.conflist $(DESTDIR)$(CNICONFDIR)/; fi

# A Debian package (target/debian/crius_<version>-1_<arch>.deb) with what `make install
# PREFIX=/usr` installs, made by cargo-deb from [package.metadata.deb] in runtime/Cargo.toml.
# cargo-deb packages release builds only; the unit and the default config are written here
# first, as install writes them, and the static daemon, shim and helper (built for an explicit
# target) copied beside them. contrib/debian/ holds the maintainer scripts.
DEB_ASSETS := target/release/deb-assets
deb: build-release cargo-deb
	rm -rf $(DEB_ASSETS)
	mkdir -p $(DEB_ASSETS)
	sed 's|@BINDIR@|/usr/bin|g' contrib/systemd/crius.service > $(DEB_ASSETS)/crius.service
	target/$(HOST_TRIPLE)/release/crius config default > $(DEB_ASSETS)/config.toml
	cp target/$(HOST_TRIPLE)/release/crius target/$(HOST_TRIPLE)/release-shim/crius-shim \
	  target/$(HOST_TRIPLE)/release-shim/crius-shim-helper $(DEB_ASSETS)/
	$(CARGO) deb -p crius --no-build --no-strip

cargo-deb: check-rust
	@$(CARGO) deb --version >/dev/null 2>&1 || $(CARGO) install --locked cargo-deb

# clippy and rustdoc for the host triple with the static build's flags, like `make build`: the
# dependencies' build scripts (zstd's and ring's C among them) then run once for all three,
# and rustdoc reuses clippy's checks of the dependencies.
lint: check-rust cargo-deny
	$(CARGO) fmt --all -- --check
	$(STATIC_ENV) $(CARGO) clippy --workspace --all-targets --target $(HOST_TRIPLE) -- -D warnings
	$(STATIC_ENV) RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --target $(HOST_TRIPLE)
	$(CARGO) fetch --locked
	$(CARGO) deny --offline check licenses bans sources

# deny.toml's licenses, duplicate versions and sources. The advisories check needs the RustSec
# database from the network: run `cargo deny check advisories` where there is one. cargo-deny
# reads the metadata of every platform's crates, which a build on this one never downloads:
# `cargo fetch` gets them first (from the registry, like the build's own).
# A debug build of cargo-deny: it checks crius's crates in about a second either way, and builds
# in 50 s instead of 150 (its release profile links with LTO), which every `make test` on a
# fresh machine pays.
cargo-deny: check-rust
	@$(CARGO) deny --version >/dev/null 2>&1 || $(CARGO) install --locked --debug cargo-deny

# The node VM (contrib/node-vm/README.md): a Debian 13 guest (systemd 257, cgroup v2 only,
# AppArmor, Linux 6.12) built by debootstrap, cached in /var/cache/crius-node-vm/<hash of its
# inputs>/ and booted by qemu (KVM where the CPU has it, TCG otherwise). test-node installs
# crius's package in it and runs the pod smoke of tests/tests/e2e/node_vm.rs with both cgroup
# drivers, then critest with each driver when CRITEST names a critest binary (results in
# /tmp/critest-node-vm-<driver>.txt). NODE_DEB: the package to test
# (default: the static debug build packaged by contrib/node-vm/debug-deb, as `make test` does;
# `make deb` makes the release one).
#  debootstrap, debian-archive-keyring: the guest's root file system from Debian's archive
#  e2fsprogs: mkfs.ext4 -d writes it to an image without a loop mount
#  qemu-system-x86, qemu-utils: the VM and its copy-on-write disk
#  openssh-client: commands and files in and out of the guest
#  socat: the guest's connections to the host's registry (qemu's guestfwd runs one for each)
NODE_VM_PACKAGES := debootstrap debian-archive-keyring e2fsprogs qemu-system-x86 qemu-utils \
                    openssh-client socat python3
# POWER_LOSS: rounds of node_vm.rs's power loss during a burst of calls (qemu killed, booted
# again; about a minute each under TCG), run by test-node only, as is the package upgrade and
# downgrade with 20 pods running.
POWER_LOSS ?= 10
# NODE_SOAK: minutes of node_vm.rs's soak (20 pods, one replaced every 30 s), test-node only.
NODE_SOAK ?= 10
DEBUG_DEB := target/node-vm/crius-debug.deb
NODE_DEB  ?= $(DEBUG_DEB)
CRITEST   ?=

test-node: deps-test node-vm-deps build node-vm-image $(if $(filter $(DEBUG_DEB),$(NODE_DEB)),node-vm-deb)
	CRIUS_NODE_DEB=$(abspath $(NODE_DEB)) CRIUS_NODE_VM_POWER_LOSS=$(POWER_LOSS) CRIUS_NODE_VM_UPGRADE=1 \
	  CRIUS_NODE_VM_SOAK=$(NODE_SOAK) \
	  $(TEST_ENV) $(TEST_CARGO) --test e2e -- node_vm:: --nocapture --test-threads 1
	$(if $(CRITEST),for driver in cgroupfs systemd; do \
	  CRIUS_NODE_VM_CGROUP_DRIVER=$$driver ./contrib/node-vm/critest $(abspath $(CRITEST)) \
	    $(abspath $(NODE_DEB)) /tmp/critest-node-vm-$$driver.txt || exit 1; done)

# crius's release package against Debian 13's containerd 1.7 in the same guest (node_vm.rs,
# bench_pod_start_against_containerd): the medians of RunPodSandbox and of create + start over
# BENCH_PODS pods each, and their ratios. Prints figures, asserts none.
BENCH_PODS ?= 10
bench-node: deps-test node-vm-deps build node-vm-image deb
	CRIUS_NODE_VM_BENCH=$(BENCH_PODS) CRIUS_NODE_DEB="$$(ls -t $(CURDIR)/target/debian/crius_*.deb | head -1)" \
	  $(TEST_ENV) $(TEST_CARGO) --test e2e -- node_vm::bench_pod_start_against_containerd --nocapture

# The soak of tests/tests/e2e/soak.rs on this machine, with the release build: SOAK_PODS pods for
# SOAK_MINUTES under kubelet's relist (1 s), stats (10 s), an ExecSync probe of each pod every
# 10 s and a churn of one pod every 6 s, crius's and its shims' RSS, fds, threads, CPU and the
# database's size printed each minute. Asserts no failed call, no log line lost or repeated, no
# error in crius's log and nothing left; prints the rest.
SOAK_MINUTES ?= 60
SOAK_PODS    ?= 110
soak: deps-test build build-release
	CRIUS_SOAK_MINUTES=$(SOAK_MINUTES) CRIUS_SOAK_PODS=$(SOAK_PODS) \
	  CRIUS_BIN=$(CURDIR)/target/$(HOST_TRIPLE)/release/crius \
	  CRIUS_SHIM_BIN=$(CURDIR)/target/$(HOST_TRIPLE)/release/crius-shim \
	  $(TEST_CARGO) --test e2e -- soak:: --nocapture

# Issue 50's figures in one command (contrib/bench/run): the lifecycle bench one call at a time,
# the reads kubelet makes under 10 writers, the scale curve (BENCH_SCALE pods) and, with CRITEST,
# critest's benchmark; with BENCH_ENDPOINT (another runtime; BENCH_HOSTS_DIR, BENCH_DAEMON_PID:
# tests/benches/README.md) the same against it, and the ratios. Prints figures, asserts none.
BENCH_OUT ?= /tmp/crius-bench-$(shell date +%Y%m%d-%H%M%S)
bench: deps-test build-release
	CRIUS_BIN=$(CURDIR)/target/$(HOST_TRIPLE)/release/crius \
	  CRIUS_SHIM_BIN=$(CURDIR)/target/$(HOST_TRIPLE)/release/crius-shim \
	  $(if $(CRITEST),CRITEST=$(abspath $(CRITEST))) ./contrib/bench/run $(BENCH_OUT)

# Kubernetes' node e2e suite (test/e2e_node, NodeConformance by default) against a crius started
# fresh from this build, through the node-e2e harness (not part of crius: NODE_E2E_HARNESS is its
# directory, NODE_E2E_DIR where it built the suite, kubelet and images). CRIUS_HANDLER=runc runs
# every pod through runc; FOCUS, SKIP, NODES, ... go to the harness. See contrib/node-e2e/run.
NODE_E2E_HARNESS ?=
NODE_E2E_RESULTS ?= $(or $(NODE_E2E_DIR),/var/tmp/node-e2e)/results/crius-$(shell date +%Y%m%d-%H%M%S)
node-e2e: deps-test build
	@test -n "$(NODE_E2E_HARNESS)" || { echo "make node-e2e NODE_E2E_HARNESS=<the node-e2e harness's directory>" >&2; exit 2; }
	./contrib/node-e2e/run $(NODE_E2E_HARNESS) $(NODE_E2E_RESULTS)

node-vm-deps:
	@./.ci/install-deps $(NODE_VM_PACKAGES)

node-vm-image: node-vm-deps
	@./contrib/node-vm/build-image >/dev/null

node-vm-deb: build
	@mkdir -p $(dir $(DEBUG_DEB))
	./contrib/node-vm/debug-deb $(HOST_TRIPLE) $(DEBUG_DEB)

deps-run:
	@./.ci/install-deps $(RUN_PACKAGES)
	@./contrib/criu/install
	@./contrib/cgroup/favordynmods

deps-test:
	@./.ci/install-deps $(TEST_PACKAGES)
	@./contrib/criu/install
	@./contrib/cgroup/hybrid-v1-only
	@./contrib/cgroup/favordynmods
	@./.ci/install-python-deps

check-rust:
	@command -v $(CARGO) >/dev/null 2>&1 || { \
	  echo "crius needs a Rust toolchain (stable, 1.90 or newer): install rustup, then 'rustup default stable'" >&2; \
	  exit 1; }
