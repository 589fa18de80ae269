//! Files that carry fencing authority, checked and written without trusting the paths to them.
//!
//! Data flow: the agent (its configuration, state directory, break-glass holds, operation
//! journal), the BMC crate (credential files) and the controller (inventory, deny list,
//! `tls_dir`, HMAC key, BMC `credentials_dir`, etcd access files) ask [`check_path`] or
//! [`check_dir_and_entries`] before they believe a file, at start and before a hot reload is
//! applied; [`judge`] is the one rule behind both. Whoever writes where another user may
//! also write (root into the agent's state directory) goes through [`SecureDir`]: one
//! directory descriptor, checked once, and every file below it opened relative to it with no
//! symlink followed.

mod check;
mod dir;

pub use check::{
    Access, FileError, Owners, SERVICE_USER, check_dir_and_entries, check_path, judge,
};
pub use dir::{MAX_READ_BYTES, ReadFile, SecureDir};
