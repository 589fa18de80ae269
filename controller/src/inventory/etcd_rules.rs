//! The structural rules of the inventory's `[etcd]` section (schemes, TLS files, credentials
//! set together), checked when the inventory loads; the files themselves are read by
//! `crate::standalone::access`.

use super::EtcdSettings;

/// The structural rules of the `[etcd]` section, checked when the inventory loads.
pub fn validate(settings: &EtcdSettings) -> Result<(), String> {
    if settings.endpoints.is_empty() {
        return Err("etcd.endpoints is empty".to_owned());
    }
    let https = settings
        .endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    let http = settings
        .endpoints
        .iter()
        .filter(|e| e.starts_with("http://"))
        .count();
    if let Some(bad) = settings
        .endpoints
        .iter()
        .find(|e| !e.starts_with("https://") && !e.starts_with("http://"))
    {
        return Err(format!(
            "etcd.endpoints: {bad} must start with https:// or http://"
        ));
    }
    if https > 0 && http > 0 {
        return Err(
            "etcd.endpoints mixes https:// and http://; etcd serves its clients one way".to_owned(),
        );
    }
    let tls_keys: Vec<&str> = [
        ("ca_file", settings.ca_file.is_some()),
        ("cert_file", settings.cert_file.is_some()),
        ("key_file", settings.key_file.is_some()),
    ]
    .into_iter()
    .filter_map(|(key, set)| set.then_some(key))
    .collect();
    if http > 0 && !tls_keys.is_empty() {
        return Err(format!(
            "etcd.{} set, but etcd.endpoints are http://: TLS files would be ignored; write https:// endpoints",
            tls_keys.join(", etcd.")
        ));
    }
    if https > 0 && settings.ca_file.is_none() {
        return Err(
            "etcd.endpoints are https:// but etcd.ca_file is not set: name the CA that signed etcd's \
             server certificates (kubeadm: /etc/kubernetes/pki/etcd/ca.crt); the system's trust \
             store is not used for etcd"
                .to_owned(),
        );
    }
    if settings.cert_file.is_some() != settings.key_file.is_some() {
        return Err("etcd.cert_file and etcd.key_file must be set together".to_owned());
    }
    if settings.username.is_some() != settings.password_file.is_some() {
        return Err("etcd.username and etcd.password_file must be set together".to_owned());
    }
    if settings.username.as_deref() == Some("") {
        return Err("etcd.username is empty".to_owned());
    }
    if http > 0 && settings.password_file.is_some() {
        return Err(
            "etcd.password_file set with http:// endpoints: the password would cross the network in clear"
                .to_owned(),
        );
    }
    Ok(())
}
