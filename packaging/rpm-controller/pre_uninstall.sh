# metalguard-controller %preun: on removal ($1 = 0) stop and disable the unit; on upgrade keep it.
if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable --now metalguard-controller.service >/dev/null 2>&1 || :
fi
