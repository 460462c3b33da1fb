package broker

import (
	"github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// flagNames renames the broker's option fields (*fielderr.Error) to the
// gpupass-broker flags that set them; TestFlagNames keeps them real.
var flagNames = fielderr.Names{
	broker.FieldRegions:               "--regions",
	broker.FieldMaxBodyMemory:         "--max-body-memory",
	broker.FieldMaxBodyMemoryPerToken: "--max-body-memory-per-token",
	broker.FieldTLSCert:               "--tls-cert",
	broker.FieldTLSKey:                "--tls-key",
}
