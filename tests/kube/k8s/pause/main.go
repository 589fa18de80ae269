// Command pause is the sandbox container of the test node's Pods (containerd's
// sandbox_image, tests/src/node): it holds the Pod's namespaces and does nothing until
// SIGINT or SIGTERM. Static (CGO_ENABLED=0), packed into an image by the harness.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
