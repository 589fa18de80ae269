//! # metalguard-e2e
//!
//! The test harness every metalguard integration and end-to-end test uses: real components on
//! loopback, never mocks.
//!
//! - [`etcd::EtcdCluster`]: N real `etcd` processes on 127.0.0.1 with OS-free ports, their own
//!   temporary directories, and fault injection (kill, hang, resume, restart, learner add); by
//!   default with TLS and client-certificate authentication in kubeadm's layout
//!   ([`etcd_pki::EtcdPki`], certificates generated per cluster).
//! - [`redfish::RedfishBmc`]: the `sushy-tools` Redfish emulator with the fake driver, bcrypt
//!   users, HTTP or HTTPS (CA-signed or self-signed CA:TRUE), random or instant power changes.
//! - [`ipmi::IpmiSim`] (OpenIPMI `ipmi_sim`) and [`ipmi::PyghmiBmc`] (`pyghmi`): IPMI-over-LAN
//!   BMCs whose power transitions are logged with timestamps for the test to read.
//! - [`blackhole::BlackHole`]: a TCP port that accepts and never answers and a UDP port that
//!   never answers, for timeout tests.
//! - [`kube::KubeCluster`]: a real Kubernetes control plane (etcd 3.6, kube-apiserver with
//!   RBAC, optionally kube-controller-manager) with clients for any user, group or
//!   ServiceAccount, fake kubelets and an audit log, envtest style.
//! - [`node::NodeBed`]: real nodes under that control plane (containerd, runc, the Debian CNI
//!   plugins, kubelet, kube-scheduler, kube-proxy) that run the shipped Deployment as Pods;
//!   one per host at a time, and it puts the host back as it found it.
//! - [`deps`]: the dependency rules of the workspace, checked from `cargo metadata`.
//!
//! Every process is killed when its handle drops (also while a test unwinds from a panic), and
//! nextest's per-test process group catches the rest. Ports come from [`ports::reserve_port`],
//! which holds a file lock per port so parallel test processes never collide, and only
//! 127.0.0.1 is bound — except by the lab's netns mode ([`netns::LabNetwork`]), whose
//! components listen on addresses of 198.18.0.0/15 inside namespaces and on a bridge it
//! creates and deletes itself.
//!
//! May depend on anything a test needs; nothing in the product depends on this crate.

pub mod blackhole;
pub mod containerd;
pub mod deps;
pub mod error;
pub mod etcd;
pub mod etcd_pki;
pub mod http;
pub mod ipmi;
pub mod kube;
pub mod kubelet;
pub mod lab;
pub mod netns;
pub mod node;
pub mod ports;
pub mod power;
pub mod process;
pub mod redfish;
pub mod soak;
pub mod tls;
pub mod tools;

pub use error::HarnessError;

/// Result type of the harness.
pub type Result<T> = std::result::Result<T, HarnessError>;
