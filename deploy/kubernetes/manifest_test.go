// Package kubernetes_test checks deploy/kubernetes/mnist-job.yaml: the
// environment the Indexed Job gives each pod must map, through the same code
// gdist.InitFromEnv runs, to ranks 0..N-1 of one job whose rendezvous is the
// index-0 pod's DNS name under the headless Service. No cluster runs here;
// this is what can be checked without one.
package kubernetes_test

import (
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/gdist/gdist/internal/launchenv"
)

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

type object struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		// Service
		ClusterIP                string            `yaml:"clusterIP"`
		PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
		Selector                 map[string]string `yaml:"selector"`
		Ports                    []struct {
			Port int `yaml:"port"`
		} `yaml:"ports"`
		// Job
		CompletionMode string `yaml:"completionMode"`
		Completions    int    `yaml:"completions"`
		Parallelism    int    `yaml:"parallelism"`
		Template       struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				Subdomain  string `yaml:"subdomain"`
				Containers []struct {
					Env   []envVar `yaml:"env"`
					Ports []struct {
						ContainerPort int `yaml:"containerPort"`
					} `yaml:"ports"`
				} `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

func load(t *testing.T) (svc, job object) {
	f, err := os.Open("mnist-job.yaml")
	require.NoError(t, err)
	defer f.Close()
	dec := yaml.NewDecoder(f)
	for {
		var o object
		if err := dec.Decode(&o); err != nil {
			break
		}
		switch o.Kind {
		case "Service":
			svc = o
		case "Job":
			job = o
		}
	}
	require.Equal(t, "Service", svc.Kind, "the manifest has a Service")
	require.Equal(t, "Job", job.Kind, "the manifest has a Job")
	return svc, job
}

func TestManifestRanks(t *testing.T) {
	svc, job := load(t)
	js, ps := job.Spec, job.Spec.Template.Spec

	// The Service is headless, publishes pods before they are ready (rank 0
	// must resolve while the others connect) and selects the job's pods.
	assert.Equal(t, "None", svc.Spec.ClusterIP)
	assert.True(t, svc.Spec.PublishNotReadyAddresses)
	for k, v := range svc.Spec.Selector {
		assert.Equal(t, v, job.Spec.Template.Metadata.Labels[k], "selector %s", k)
	}
	assert.Equal(t, svc.Metadata.Name, ps.Subdomain, "pods live under the Service's subdomain")

	// An Indexed Job with every rank running at once.
	assert.Equal(t, "Indexed", js.CompletionMode)
	require.Positive(t, js.Completions)
	assert.Equal(t, js.Completions, js.Parallelism, "all ranks must run at once")
	require.Len(t, ps.Containers, 1)
	c := ps.Containers[0]

	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		default:
			env[e.Name] = e.Value
		}
	}
	assert.Equal(t, "secret:gdist-token/token", env["GDIST_TOKEN"], "the token comes from a Secret")
	world, err := strconv.Atoi(env["WORLD_SIZE"])
	require.NoError(t, err)
	assert.Equal(t, js.Completions, world, "WORLD_SIZE matches completions")

	// Kubernetes names Indexed Job pods <job>-<index>; under the subdomain
	// rank 0 is <job>-0.<service>.
	master := job.Metadata.Name + "-0." + svc.Metadata.Name
	port := svc.Spec.Ports[0].Port
	require.NotEmpty(t, c.Ports)
	assert.Equal(t, port, c.Ports[0].ContainerPort)

	seen := map[int]bool{}
	for index := range js.Completions {
		pod := map[string]string{"JOB_COMPLETION_INDEX": strconv.Itoa(index)} // set by Kubernetes
		for k, v := range env {
			pod[k] = v
		}
		got, err := launchenv.FromEnv(func(k string) (string, bool) { v, ok := pod[k]; return v, ok })
		require.NoError(t, err, "pod %d", index)
		assert.Equal(t, launchenv.Kubernetes, got.Launcher)
		assert.Equal(t, index, got.Rank, "pod %d", index)
		assert.Equal(t, world, got.WorldSize)
		assert.Equal(t, 0, got.LocalRank, "one rank per pod")
		assert.Equal(t, master, got.MasterAddr)
		assert.Equal(t, port, got.MasterPort)
		assert.True(t, got.Multihost, "pods listen beyond loopback")
		seen[got.Rank] = true
	}
	assert.Len(t, seen, world, "every rank exactly once")
}
