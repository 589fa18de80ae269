use super::{
    Action, BmcAction, action_of, address_of, metadata, parse_args, parse_stdin, target_of,
};

fn args(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn command_line_long_short_and_inline_values() {
    let options = parse_args(&args("-o off -a 10.0.0.5 --ipport=8443 -l admin --ssl-insecure --systems-uri /redfish/v1/Systems/1")).unwrap();
    assert_eq!(action_of(&options).unwrap(), Action::Run(BmcAction::Off));
    assert_eq!(options.get("ip"), Some("10.0.0.5"));
    assert!(options.flag("ssl_insecure"));
    let address = address_of(&options).unwrap();
    assert_eq!(
        address.to_string(),
        "redfish+https://10.0.0.5:8443/redfish/v1/Systems/1"
    );
    assert!(
        parse_args(&args("--frobnicate 1"))
            .unwrap_err()
            .contains("frobnicate")
    );
    assert!(parse_args(&args("-o")).is_err());
    let options = parse_args(&args("-ostatus -P -a bmc")).unwrap();
    assert_eq!(options.get("action"), Some("status"));
    assert_eq!(address_of(&options).unwrap().to_string(), "ipmi://bmc:623");
    assert!(!options.password_on_argv);
    assert!(parse_args(&args("-p secret")).unwrap().password_on_argv);
}

#[test]
fn stdin_lines_follow_the_fence_agent_rules() {
    let (options, warnings) = parse_stdin(
        "# from pacemaker\n\naction=reboot\nnodename=node-1\nipaddr=\"bmc.example\"\n\
         login='root'\npasswd=pa ss\nplug=node-1\naction=off\nfrobnicate=1\nnotls=1\nipport=8000\n",
    );
    assert_eq!(
        warnings,
        ["ignoring unknown option frobnicate on stdin line 10 (value not shown)"]
    );
    assert_eq!(
        action_of(&options).unwrap(),
        Action::Run(BmcAction::Off),
        "last key wins"
    );
    assert_eq!(
        options.get("ip"),
        Some("bmc.example"),
        "quotes stripped, alias mapped"
    );
    assert_eq!(options.get("username"), Some("root"));
    assert_eq!(options.get("password"), Some("pa ss"));
    assert_eq!(
        address_of(&options).unwrap().to_string(),
        "redfish+http://bmc.example:8000"
    );
    let target = target_of(&options).unwrap();
    assert_eq!(target.credentials.username(), "root");
    assert!(!format!("{target:?}").contains("pa ss"));
}

#[test]
fn defaults_and_refusals() {
    let (options, _) = parse_stdin("ip=h\n");
    assert_eq!(action_of(&options).unwrap(), Action::Run(BmcAction::Reboot));
    assert!(target_of(&options).unwrap_err().contains("no credentials"));
    let (options, _) = parse_stdin("action=list\n");
    assert!(action_of(&options).is_err());
    let (options, _) = parse_stdin("action=off\nusername=a\npassword=b\n");
    assert!(target_of(&options).unwrap_err().contains("no bmc address"));
    let (options, _) = parse_stdin("bmc=redfish://user:pw@h\nusername=a\npassword=b\n");
    let problem = target_of(&options).unwrap_err();
    assert!(
        problem.contains("carries credentials") && !problem.contains("pw"),
        "{problem}"
    );
    let (options, _) = parse_stdin("ip=h\nusername=a\npassword=b\npower_timeout=abc\n");
    assert!(
        options
            .seconds("power_timeout", std::time::Duration::ZERO)
            .is_err()
    );
}

#[test]
fn metadata_lists_every_option_and_action() {
    let xml = metadata();
    assert!(xml.starts_with("<?xml version=\"1.0\" ?>\n<resource-agent name=\"fence_metalguard\""));
    for name in [
        "action",
        "ip",
        "ipaddr",
        "login",
        "passwd",
        "password",
        "credentials",
        "power_timeout",
    ] {
        assert!(
            xml.contains(&format!("<parameter name=\"{name}\"")),
            "{name}"
        );
    }
    for action in [
        "on",
        "off",
        "reboot",
        "status",
        "monitor",
        "metadata",
        "validate-all",
    ] {
        assert!(
            xml.contains(&format!("<action name=\"{action}\"")),
            "{action}"
        );
    }
    assert!(xml.contains("<getopt mixed=\"-o, --action=[action]\" />"));
}

#[test]
fn impossible_seconds_are_a_clear_error_not_a_panic() {
    for value in ["1e30", "-1", "NaN", "inf", "-inf", "86401", "1e400", "x"] {
        let options = parse_args(&args(&format!("--delay={value}"))).unwrap();
        let problem = options
            .seconds("delay", std::time::Duration::ZERO)
            .unwrap_err();
        assert!(problem.contains("delay"), "{value}: {problem}");
    }
    let options = parse_args(&args("--delay=2.5 --power-timeout=86400")).unwrap();
    assert_eq!(
        options.seconds("delay", std::time::Duration::ZERO),
        Ok(std::time::Duration::from_millis(2500))
    );
    assert!(
        options
            .seconds("power_timeout", std::time::Duration::ZERO)
            .is_ok()
    );
}

#[test]
fn stray_stdin_lines_are_warned_about_without_their_content() {
    let (options, warnings) = parse_stdin(
        "action=off\nhunter2-pasted-here\npasswd_tpyo=hunter2\n\u{1b}[2Jescape=1\n\
         a_very_long_unknown_key_that_goes_on_and_on_and_on_and_on_and_on_and_on_and_on_and_on=1\n",
    );
    assert_eq!(options.get("action"), Some("off"));
    assert_eq!(warnings.len(), 4, "{warnings:?}");
    for warning in &warnings {
        assert!(!warning.contains("hunter2"), "{warning}");
        assert!(!warning.contains('\u{1b}'), "{warning}");
        assert!(warning.len() < 160, "{warning}");
    }
    assert!(warnings[0].contains("line 2"), "{warnings:?}");
    assert!(warnings[1].contains("passwd_tpyo"), "{warnings:?}");
}
