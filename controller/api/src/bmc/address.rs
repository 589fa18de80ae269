//! BMC addresses as URLs.
//!
//! Accepted spellings (the metal3 ones where they mean the same thing):
//!
//! | scheme | protocol | default port |
//! |---|---|---|
//! | `redfish+https://`, `redfish://`, `idrac-redfish://`, `idrac-redfish+https://`, `ilo5-redfish://`, `ilo5-redfish+https://` | Redfish over HTTPS | 443 |
//! | `redfish+http://`, `idrac-redfish+http://`, `ilo5-redfish+http://` | Redfish over HTTP | 80 |
//! | `ipmi://`, `ipmi+lanplus://` | IPMI v2.0 RMCP+ over UDP | 623 |
//!
//! A Redfish path, when given, names the System (`/redfish/v1/Systems/1`). Credentials in the
//! URL are refused, and never echoed back in an error; so are a query and a fragment (a BMC
//! address has no use for them, and a token in one would travel wherever the address goes:
//! to every agent and into `status`). Quoted addresses are cut to
//! [`crate::text::EXCERPT_CHARS`] characters with control characters escaped.

use std::fmt;
use std::str::FromStr;

use url::Url;

/// Default Redfish HTTPS port.
pub const DEFAULT_HTTPS_PORT: u16 = 443;
/// Default Redfish HTTP port.
pub const DEFAULT_HTTP_PORT: u16 = 80;
/// Default IPMI RMCP+ UDP port.
pub const DEFAULT_IPMI_PORT: u16 = 623;

/// Why a BMC address was refused. Messages quote the address only through [`redact`]: never
/// a user, a password, a query or a fragment, whatever the address's form.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddressError {
    /// The text is not a URL.
    #[error("bmc address {address} is not a url")]
    NotUrl {
        /// The address as given.
        address: String,
    },
    /// The scheme is none of the accepted ones.
    #[error(
        "bmc address {address} has unsupported scheme {scheme} (use redfish+https, redfish+http or ipmi)"
    )]
    Scheme {
        /// The address as given.
        address: String,
        /// The scheme found.
        scheme: String,
    },
    /// The URL carries a user name or password.
    #[error(
        "bmc address for host {host} carries credentials; pass them with --credentials instead"
    )]
    Credentials {
        /// The host part only.
        host: String,
    },
    /// No host.
    #[error("bmc address {address} has no host")]
    NoHost {
        /// The address as given.
        address: String,
    },
    /// The URL has a query (`?…`) or a fragment (`#…`); neither is quoted.
    #[error(
        "bmc address for host {host} has a query or fragment, which a bmc address does not use"
    )]
    Query {
        /// The host part only.
        host: String,
    },
    /// An IPMI address with a path, or a Redfish path outside `/redfish/v1/`.
    #[error("bmc address {address} has an unexpected path {path}")]
    Path {
        /// The address as given.
        address: String,
        /// The path found.
        path: String,
    },
}

/// Which protocol speaks to the BMC, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Redfish over HTTPS.
    RedfishHttps,
    /// Redfish over plain HTTP.
    RedfishHttp,
    /// IPMI v2.0 RMCP+ over UDP.
    Ipmi,
}

/// A parsed BMC address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BmcAddress {
    /// The protocol.
    pub transport: Transport,
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// Port (the protocol's default when not given).
    pub port: u16,
    /// Redfish System URI named in the address (e.g. `/redfish/v1/Systems/1`), if any.
    pub system_path: Option<String>,
}

impl BmcAddress {
    /// The Redfish base URL (`https://host:port`), for Redfish transports.
    pub fn base_url(&self) -> String {
        let scheme = match self.transport {
            Transport::RedfishHttp => "http",
            Transport::RedfishHttps | Transport::Ipmi => "https",
        };
        format!("{scheme}://{}", self.host_port())
    }

    /// `host:port`, with IPv6 hosts in brackets.
    pub fn host_port(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for BmcAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.transport {
            Transport::Ipmi => write!(f, "ipmi://{}", self.host_port()),
            Transport::RedfishHttp | Transport::RedfishHttps => {
                let scheme = if self.transport == Transport::RedfishHttp {
                    "redfish+http"
                } else {
                    "redfish+https"
                };
                write!(
                    f,
                    "{scheme}://{}{}",
                    self.host_port(),
                    self.system_path.as_deref().unwrap_or("")
                )
            }
        }
    }
}

impl FromStr for BmcAddress {
    type Err = AddressError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let url = Url::parse(text).map_err(|_| AddressError::NotUrl {
            address: redact(text),
        })?;
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned());
        if !url.username().is_empty() || url.password().is_some() {
            return Err(AddressError::Credentials {
                host: crate::text::excerpt(&host.unwrap_or_default(), crate::text::EXCERPT_CHARS),
            });
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(AddressError::Query {
                host: host.unwrap_or_default(),
            });
        }
        let address = redact(text);
        let transport = match url.scheme() {
            "redfish+https"
            | "redfish"
            | "idrac-redfish"
            | "idrac-redfish+https"
            | "ilo5-redfish"
            | "ilo5-redfish+https"
            | "redfish-https" => Transport::RedfishHttps,
            "redfish+http" | "idrac-redfish+http" | "ilo5-redfish+http" | "redfish-http" => {
                Transport::RedfishHttp
            }
            "ipmi" | "ipmi+lanplus" => Transport::Ipmi,
            other => {
                return Err(AddressError::Scheme {
                    address,
                    scheme: redact(other),
                });
            }
        };
        let Some(host) = host else {
            return Err(AddressError::NoHost { address });
        };
        let port = url.port().unwrap_or(match transport {
            Transport::RedfishHttps => DEFAULT_HTTPS_PORT,
            Transport::RedfishHttp => DEFAULT_HTTP_PORT,
            Transport::Ipmi => DEFAULT_IPMI_PORT,
        });
        let path = url.path().trim_end_matches('/');
        let system_path = match (transport, path) {
            (_, "") => None,
            (Transport::Ipmi, other) => {
                return Err(AddressError::Path {
                    address,
                    path: redact(other),
                });
            }
            (_, other) if other.starts_with("/redfish/v1/") => Some(other.to_owned()),
            (_, other) => {
                return Err(AddressError::Path {
                    address,
                    path: redact(other),
                });
            }
        };
        Ok(Self {
            transport,
            host,
            port,
            system_path,
        })
    }
}

/// What an error may quote of an address: everything between the scheme and the last `@` (a
/// user and password, whatever the spelling: `scheme://u:p@h`, `scheme:/u:p@h`, `scheme:u:p@h`)
/// replaced, a query or fragment after it dropped, cut to [`crate::text::EXCERPT_CHARS`]
/// characters with control characters escaped. The password of `redfish+http:/admin:PW@…`
/// was quoted by the errors of an address that parses but has no host (issue 28).
pub fn redact(text: &str) -> String {
    let kept = match text.rfind('@') {
        Some(at) => {
            let rest = &text[at + 1..];
            match text[..at].find(':') {
                Some(colon) => {
                    let slashes = if text[colon..].starts_with("://") {
                        "//"
                    } else {
                        ""
                    };
                    format!("{}:{slashes}<redacted>@{rest}", &text[..colon])
                }
                None => format!("<redacted>@{rest}"),
            }
        }
        None => text.to_owned(),
    };
    // A query or fragment may carry a token; it is never quoted.
    let kept = match kept.find(['?', '#']) {
        Some(cut) => format!("{}<query dropped>", &kept[..cut]),
        None => kept,
    };
    crate::text::excerpt(&kept, crate::text::EXCERPT_CHARS)
}

#[cfg(test)]
mod tests {
    use super::{AddressError, BmcAddress, Transport};

    fn parse(text: &str) -> BmcAddress {
        text.parse().unwrap()
    }

    #[test]
    fn redfish_spellings() {
        let a = parse("redfish+https://bmc.example:8443/redfish/v1/Systems/1");
        assert_eq!(a.transport, Transport::RedfishHttps);
        assert_eq!(a.port, 8443);
        assert_eq!(a.system_path.as_deref(), Some("/redfish/v1/Systems/1"));
        assert_eq!(a.base_url(), "https://bmc.example:8443");
        for metal3 in ["redfish://h", "idrac-redfish://h", "ilo5-redfish://h"] {
            let a = parse(metal3);
            assert_eq!(a.transport, Transport::RedfishHttps, "{metal3}");
            assert_eq!(a.port, 443);
            assert_eq!(a.system_path, None);
        }
        let a = parse("redfish+http://10.0.0.5/");
        assert_eq!(a.transport, Transport::RedfishHttp);
        assert_eq!(a.port, 80);
        assert_eq!(a.to_string(), "redfish+http://10.0.0.5:80");
    }

    #[test]
    fn ipmi_and_ipv6() {
        let a = parse("ipmi://[fd00::5]");
        assert_eq!(a.transport, Transport::Ipmi);
        assert_eq!(a.host, "fd00::5");
        assert_eq!(a.port, 623);
        assert_eq!(a.host_port(), "[fd00::5]:623");
        assert_eq!(parse("ipmi://10.0.0.5:6230").port, 6230);
    }

    #[test]
    fn an_address_without_slashes_is_refused_without_its_password() {
        // Both parse as URLs without a host; their errors quoted the password (issue 28).
        for (text, quoted) in [
            (
                "redfish+http:/admin:hunter2@10.0.0.5",
                "redfish+http:<redacted>@10.0.0.5",
            ),
            ("ipmi:admin:hunter2@10.0.0.5", "ipmi:<redacted>@10.0.0.5"),
            ("ipmi:admin:p@ss@word@10.0.0.5", "ipmi:<redacted>@10.0.0.5"),
        ] {
            let err = text.parse::<BmcAddress>().unwrap_err().to_string();
            assert!(
                !err.contains("hunter2") && !err.contains("word"),
                "{text}: {err}"
            );
            assert!(err.contains(quoted), "{text}: {err}");
        }
        assert_eq!(
            super::redact("ipmi://u:hunter2@bmc#hunter2"),
            "ipmi://<redacted>@bmc<query dropped>"
        );
    }

    #[test]
    fn refusals_never_echo_credentials() {
        let err = "redfish://admin:hunter2@bmc"
            .parse::<BmcAddress>()
            .unwrap_err();
        assert_eq!(err, AddressError::Credentials { host: "bmc".into() });
        assert!(!err.to_string().contains("hunter2"));
        let err = "redfish://admin:hunter2@"
            .parse::<BmcAddress>()
            .unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        let err = "not a url hunter2@x".parse::<BmcAddress>().unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(matches!(
            "ftp://h".parse::<BmcAddress>(),
            Err(AddressError::Scheme { .. })
        ));
        for secret in [
            "redfish+https://bmc/redfish/v1/Systems/1?token=hunter2",
            "ipmi://bmc#hunter2",
        ] {
            let err = secret.parse::<BmcAddress>().unwrap_err();
            assert_eq!(err, AddressError::Query { host: "bmc".into() });
            assert!(!err.to_string().contains("hunter2"), "{err}");
        }
        let long = format!("ftp://h/{}", "\u{1b}[2J".repeat(10_000));
        let err = long.parse::<BmcAddress>().unwrap_err().to_string();
        assert!(err.len() < 400 && !err.contains('\u{1b}'), "{err}");
        assert!(matches!(
            "ipmi://h/x".parse::<BmcAddress>(),
            Err(AddressError::Path { .. })
        ));
        assert!(matches!(
            "redfish://h/other".parse::<BmcAddress>(),
            Err(AddressError::Path { .. })
        ));
    }
}
