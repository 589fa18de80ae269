//! The fence-agent metadata XML, generated from the option table.

use std::fmt::Write as _;

use super::options::{Kind, SPECS};
fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The agent's metadata XML (validates against fence-agents' `metadata.rng`).
pub(super) fn metadata() -> String {
    let mut xml = String::from(
        "<?xml version=\"1.0\" ?>\n<resource-agent name=\"fence_metalguard\" shortdesc=\"Fence agent for Redfish and IPMI BMCs with verified power-off (metalguard)\" >\n\
         <longdesc>fence_metalguard (metalguard-agent fence-agent) powers a machine off, on or reboots it through its BMC over Redfish (HTTPS/HTTP) or IPMI v2.0 RMCP+, reads the power state back until the change is verified, bounds every call with timeouts, and never logs the password.</longdesc>\n\
         <vendor-url>https://example.invalid/metalguard</vendor-url>\n<parameters>\n",
    );
    for spec in SPECS {
        let getopt = {
            let value = match spec.kind {
                Kind::Flag => String::new(),
                _ => format!("=[{}]", spec.name),
            };
            let long = format!("--{}{value}", spec.name.replace('_', "-"));
            match spec.short {
                Some(short) => format!("-{short}, {long}"),
                None => long,
            }
        };
        let kind = match spec.kind {
            Kind::Flag => "boolean",
            Kind::Text => "string",
            Kind::Integer => "integer",
            Kind::Seconds => "second",
        };
        let default = spec
            .default
            .map(|d| format!(" default=\"{}\"", xml_escape(d)))
            .unwrap_or_default();
        let _ = write!(
            xml,
            "\t<parameter name=\"{}\" unique=\"0\" required=\"{}\">\n\t\t<getopt mixed=\"{}\" />\n\t\t<content type=\"{kind}\"{default} />\n\t\t<shortdesc lang=\"en\">{}</shortdesc>\n\t</parameter>\n",
            spec.name,
            u8::from(spec.required),
            xml_escape(&getopt),
            xml_escape(spec.description)
        );
        for alias in spec.aliases {
            let _ = write!(
                xml,
                "\t<parameter name=\"{alias}\" unique=\"0\" required=\"0\" deprecated=\"1\">\n\t\t<getopt mixed=\"{}\" />\n\t\t<content type=\"{kind}\" />\n\t\t<shortdesc lang=\"en\">{}</shortdesc>\n\t</parameter>\n",
                xml_escape(&getopt),
                xml_escape(spec.description)
            );
        }
    }
    xml.push_str("</parameters>\n<actions>\n");
    for (action, extra) in [
        ("on", " automatic=\"0\""),
        ("off", ""),
        ("reboot", ""),
        ("status", ""),
        ("monitor", ""),
        ("metadata", ""),
        ("validate-all", ""),
    ] {
        let _ = writeln!(xml, "\t<action name=\"{action}\"{extra} />");
    }
    xml.push_str("</actions>\n</resource-agent>\n");
    xml
}
