# metalguard-controller %post: user and the unit enabled (not started: the unit's
# ConditionPathExists keeps it inactive until /etc/metalguard/inventory.toml exists). On upgrade
# ($1 = 2) a running controller is restarted with the new binary.
systemd-sysusers metalguard-controller.conf || :
mkdir -p /etc/metalguard
if [ "$1" -eq 1 ]; then
    systemctl --no-reload preset metalguard-controller.service >/dev/null 2>&1 || :
    systemctl enable metalguard-controller.service >/dev/null 2>&1 || :
fi
systemctl daemon-reload >/dev/null 2>&1 || :
if [ "$1" -ge 2 ]; then
    systemctl try-restart metalguard-controller.service >/dev/null 2>&1 || :
fi
