module github.com/gpupass/gpupass

go 1.26

require (
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.9
	gopkg.in/yaml.v3 v3.0.1
)

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/sethvargo/go-envconfig v0.8.0 // indirect
	github.com/sethvargo/go-githubactions v1.1.0 // indirect
)
