//! A `HostHealthCheck` as the core reads it: its selector, unhealthy conditions, `maxUnhealthy`
//! and timeouts become a [`HealthCheck`], its `remediation` the [`RemediationSettings`]. A
//! duration that does not parse is an error naming the check and the field, never a default.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt as _;
use metalguard_api::duration::parse_duration;
use metalguard_api::k8s::HostHealthCheck;
use metalguard_api::k8s::health_check::ConditionStatus as KubeStatus;
use metalguard_api::policy::{
    HealthCheck, MaxUnhealthy, RemediationSettings, Selector, UnhealthyCondition,
};
use metalguard_api::snapshot::ConditionStatus;

fn duration(check: &str, field: &str, text: &str) -> Result<std::time::Duration, String> {
    parse_duration(text).map_err(|e| format!("HostHealthCheck {check}: {field} {text:?}: {e}"))
}

pub fn health_check(check: &HostHealthCheck) -> Result<HealthCheck, String> {
    let name = check.name_any();
    let spec = &check.spec;
    if spec
        .selector
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return Err(format!(
            "HostHealthCheck {name}: selector.matchExpressions is not supported; use matchLabels"
        ));
    }
    let unhealthy_conditions = spec
        .unhealthy_conditions
        .iter()
        .map(|c| {
            Ok(UnhealthyCondition {
                type_: c.type_.clone(),
                status: match c.status {
                    KubeStatus::True => ConditionStatus::True,
                    KubeStatus::False => ConditionStatus::False,
                    KubeStatus::Unknown => ConditionStatus::Unknown,
                },
                timeout: duration(&name, "unhealthyConditions.timeout", &c.timeout)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(HealthCheck {
        name: name.clone(),
        selector: Selector {
            match_labels: spec.selector.match_labels.clone().unwrap_or_default(),
            role: None,
        },
        unhealthy_conditions,
        // Kept as written: the core parses it and a bad value blocks remediation (MAO).
        max_unhealthy: spec.max_unhealthy.as_ref().map(|m| match m {
            IntOrString::Int(n) => MaxUnhealthy::Count(u32::try_from(*n).unwrap_or(0)),
            IntOrString::String(s) => MaxUnhealthy::Text(s.clone()),
        }),
        node_startup_timeout: spec
            .node_startup_timeout
            .as_deref()
            .map(|t| duration(&name, "nodeStartupTimeout", t))
            .transpose()?,
        agent_heartbeat_timeout: spec
            .agent_heartbeat_timeout
            .as_deref()
            .map(|t| duration(&name, "agentHeartbeatTimeout", t))
            .transpose()?,
    })
}

/// Remediation settings come from the first check by name (the core has one set).
pub fn remediation_settings(check: &HostHealthCheck) -> Result<RemediationSettings, String> {
    let name = check.name_any();
    let mut settings = RemediationSettings {
        strategy: check.effective_strategy().map_err(|e| e.to_string())?,
        ..RemediationSettings::default()
    };
    if let Some(r) = &check.spec.remediation {
        if let Some(action) = r.node_action {
            settings.node_handling = action.into();
        }
        if let Some(retries) = r.max_retries {
            if retries > metalguard_api::policy::MAX_MAX_RETRY {
                return Err(format!(
                    "HostHealthCheck {name}: remediation.maxRetries is {retries}; at most {} retries may be allowed",
                    metalguard_api::policy::MAX_MAX_RETRY
                ));
            }
            settings.max_retry = retries;
        }
        if let Some(p) = &r.retry_period {
            settings.retry_period = duration(&name, "remediation.retryPeriod", p)?;
        }
        if let Some(p) = &r.min_healthy_period {
            settings.min_healthy_period = duration(&name, "remediation.minHealthyPeriod", p)?;
        }
        if let Some(t) = &r.executor_heartbeat_timeout {
            let field = "remediation.executorHeartbeatTimeout";
            settings.executor_heartbeat_timeout = duration(&name, field, t)?;
            // Zero would leave no agent to execute anything and no view to count: named here
            // by its field rather than by the standalone key the inventory checks name.
            if settings.executor_heartbeat_timeout.is_zero() {
                return Err(format!(
                    "HostHealthCheck {name}: {field} must be greater than zero"
                ));
            }
        }
    }
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(remediation: &serde_json::Value) -> HostHealthCheck {
        serde_json::from_value(json!({"apiVersion": "metalguard.io/v1alpha1",
            "kind": "HostHealthCheck", "metadata": {"name": "cp", "namespace": "mg"},
            "spec": {"selector": {}, "remediation": remediation}}))
        .unwrap()
    }

    #[test]
    fn max_retries_past_the_bound_is_refused_naming_the_check() {
        let error =
            remediation_settings(&check(&json!({"maxRetries": 4_294_967_295_u32}))).unwrap_err();
        assert!(
            error.contains("HostHealthCheck cp: remediation.maxRetries is 4294967295"),
            "{error}"
        );
        let top = metalguard_api::policy::MAX_MAX_RETRY;
        assert!(remediation_settings(&check(&json!({"maxRetries": top}))).is_ok());
    }

    #[test]
    fn a_checks_remediation_settings_include_the_executor_heartbeat_timeout() {
        let set = remediation_settings(&check(&json!({
            "maxRetries": 1, "retryPeriod": "2s", "minHealthyPeriod": "20s",
            "executorHeartbeatTimeout": "5s"})))
        .unwrap();
        assert_eq!(
            (set.max_retry, set.retry_period, set.min_healthy_period),
            (
                1,
                std::time::Duration::from_secs(2),
                std::time::Duration::from_secs(20)
            )
        );
        assert_eq!(
            set.executor_heartbeat_timeout,
            std::time::Duration::from_secs(5)
        );
        // Unset: the standalone default.
        assert_eq!(
            remediation_settings(&check(&json!({})))
                .unwrap()
                .executor_heartbeat_timeout,
            metalguard_api::policy::DEFAULT_EXECUTOR_HEARTBEAT_TIMEOUT
        );
        let error =
            remediation_settings(&check(&json!({"executorHeartbeatTimeout": "soon"}))).unwrap_err();
        assert!(
            error
                .starts_with("HostHealthCheck cp: remediation.executorHeartbeatTimeout \"soon\": "),
            "{error}"
        );
    }
}
