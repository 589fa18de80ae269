# metalguard-agent %postun: reload units; on removal ($1 = 0) remove the state directory.
systemctl daemon-reload >/dev/null 2>&1 || :
if [ "$1" -eq 0 ]; then
    rm -rf /var/lib/metalguard
fi
