package agent

import (
	daemon "github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// flagNames renames the daemon's option fields (*fielderr.Error) to the
// flags that set them (each also GPUPASS_<FLAG>, as --help says);
// TestFlagNames keeps every entry a real flag.
var flagNames = fielderr.Names{
	daemon.FieldBrokerURL:      "--broker-url",
	daemon.FieldStateDir:       "--state-dir",
	daemon.FieldBrokerToken:    "--broker-token",
	daemon.FieldRegion:         "--region",
	daemon.FieldStorageClass:   "--storage-class",
	daemon.FieldPricePerHour:   "--price-per-hour",
	daemon.FieldBandwidth:      "--bandwidth-gbps",
	daemon.FieldJobAddress:     "--job-address",
	daemon.FieldJobPorts:       "--job-ports",
	daemon.FieldSuiteInterval:  "--suite-interval",
	daemon.FieldRunLogLines:    "--run-log-lines-per-second",
	daemon.FieldRunLogMB:       "--run-log-max-mb",
	daemon.FieldKeepRuns:       "--keep-runs",
	daemon.FieldReadProbeMB:    "--read-probe-mb",
	daemon.FieldRunCgroup:      "--run-cgroup",
	daemon.FieldRunPidsMax:     "--run-pids-max",
	daemon.FieldRunPrivateTmp:  "--run-private-tmp",
	daemon.FieldRunShmSize:     "--run-shm-size",
	daemon.FieldRunKillTimeout: "--run-kill-timeout",
	bundle.FieldUsername:       "--registry-username",
	bundle.FieldPassword:       "--registry-password",
	daemon.FieldExecutor:       "--executor",
	executor.FieldRunAs:        "--run-as",
	api.FieldCA:                "--tls-ca",
	api.FieldInsecureHTTP:      "--insecure-http (or GPUPASS_INSECURE_HTTP=true)",
	executor.FieldUIDRange:     "--run-as-range",
}

// allFlagNames is flagNames and each backend's (Backend.FlagNames).
func allFlagNames() fielderr.Names {
	names := fielderr.Names{}
	for field, flag := range flagNames {
		names[field] = flag
	}
	for _, b := range newBackends() {
		for field, flag := range b.FlagNames() {
			names[field] = flag
		}
	}
	return names
}
