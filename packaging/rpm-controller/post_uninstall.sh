# metalguard-controller %postun: reload units (the controller keeps no files of its own).
systemctl daemon-reload >/dev/null 2>&1 || :
