# metalguard-agent %post: user, drop-in directory, and the unit enabled (not started: the
# unit's ExecCondition keeps it inactive until agent.toml sets `host`). On upgrade
# ($1 = 2) a running agent is restarted with the new binary.
systemd-sysusers metalguard-agent.conf || :
mkdir -p /etc/metalguard/agent.d
if [ "$1" -eq 1 ]; then
    systemctl --no-reload preset metalguard-agent.service >/dev/null 2>&1 || :
    systemctl enable metalguard-agent.service >/dev/null 2>&1 || :
fi
systemctl daemon-reload >/dev/null 2>&1 || :
if [ "$1" -ge 2 ]; then
    systemctl try-restart metalguard-agent.service >/dev/null 2>&1 || :
fi
