// Package kubernetes_test checks deploy/kubernetes/mnist-job.yaml: the
// environment the Indexed Job gives each pod must map, through the same code
// gdist.InitFromEnv runs, to ranks 0..N-1 of one job whose rendezvous is the
// index-0 pod's DNS name under the headless Service; the pods must have
// memory requests and limits, run the image of deploy/Dockerfile as its
// user with -data, keep checkpoints on a shared claim, and restart as
// gdistrun -max-restarts does. No cluster runs here; this is what can be
// checked without one.
package kubernetes_test

import (
	"errors"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
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
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

// resources are a container's requests or limits.
type resources struct {
	CPU    string `yaml:"cpu"`
	Memory string `yaml:"memory"`
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
		// PersistentVolumeClaim
		AccessModes []string `yaml:"accessModes"`
		Resources   struct {
			Requests struct {
				Storage string `yaml:"storage"`
			} `yaml:"requests"`
		} `yaml:"resources"`
		// Job
		CompletionMode       string `yaml:"completionMode"`
		Completions          int    `yaml:"completions"`
		Parallelism          int    `yaml:"parallelism"`
		BackoffLimit         *int   `yaml:"backoffLimit"`
		BackoffLimitPerIndex *int   `yaml:"backoffLimitPerIndex"`
		MaxFailedIndexes     *int   `yaml:"maxFailedIndexes"`
		PodReplacementPolicy string `yaml:"podReplacementPolicy"`
		PodFailurePolicy     *struct {
			Rules []struct {
				Action      string `yaml:"action"`
				OnExitCodes *struct {
					ContainerName string `yaml:"containerName"`
					Operator      string `yaml:"operator"`
					Values        []int  `yaml:"values"`
				} `yaml:"onExitCodes"`
				OnPodConditions []struct {
					Type string `yaml:"type"`
				} `yaml:"onPodConditions"`
			} `yaml:"rules"`
		} `yaml:"podFailurePolicy"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				Subdomain       string `yaml:"subdomain"`
				RestartPolicy   string `yaml:"restartPolicy"`
				SecurityContext struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
					RunAsUser    int  `yaml:"runAsUser"`
					RunAsGroup   int  `yaml:"runAsGroup"`
					FSGroup      int  `yaml:"fsGroup"`
				} `yaml:"securityContext"`
				Containers []struct {
					Name    string   `yaml:"name"`
					Command []string `yaml:"command"`
					Env     []envVar `yaml:"env"`
					Ports   []struct {
						ContainerPort int `yaml:"containerPort"`
					} `yaml:"ports"`
					VolumeMounts []struct {
						Name      string `yaml:"name"`
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
					Resources struct {
						Requests resources `yaml:"requests"`
						Limits   resources `yaml:"limits"`
					} `yaml:"resources"`
				} `yaml:"containers"`
				Volumes []struct {
					Name                  string `yaml:"name"`
					PersistentVolumeClaim *struct {
						ClaimName string `yaml:"claimName"`
					} `yaml:"persistentVolumeClaim"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

func load(t *testing.T) (svc, job object) {
	objs := loadAll(t)
	return objs["Service"], objs["Job"]
}

// loadAll returns the manifest's objects by kind (one of each).
func loadAll(t *testing.T) map[string]object {
	f, err := os.Open("mnist-job.yaml")
	require.NoError(t, err)
	defer f.Close()
	dec := yaml.NewDecoder(f)
	objs := map[string]object{}
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the manifest parses")
		require.NotContains(t, objs, o.Kind, "one %s", o.Kind)
		objs[o.Kind] = o
	}
	for _, kind := range []string{"Service", "PersistentVolumeClaim", "Job"} {
		require.Contains(t, objs, kind, "the manifest has a %s", kind)
	}
	return objs
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

// bytesOf parses a Kubernetes memory or storage quantity with a binary
// suffix (Ki, Mi, Gi, Ti) or none.
func bytesOf(t *testing.T, q string) int64 {
	t.Helper()
	m := regexp.MustCompile(`^([0-9]+)(Ki|Mi|Gi|Ti)?$`).FindStringSubmatch(q)
	require.NotNil(t, m, "quantity %q", q)
	n, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	shift := map[string]uint{"": 0, "Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40}[m[2]]
	return n << shift
}

// flagValue returns the value after flag in argv, or "".
func flagValue(argv []string, flag string) string {
	if i := slices.Index(argv, flag); i >= 0 && i+1 < len(argv) {
		return argv[i+1]
	}
	return ""
}

// TestManifestOperations: memory requests and limits, the image's command
// with -data, checkpoints on a shared claim, and restarts that match
// gdistrun -max-restarts.
func TestManifestOperations(t *testing.T) {
	objs := loadAll(t)
	job, pvc := objs["Job"], objs["PersistentVolumeClaim"]
	js, ps := job.Spec, job.Spec.Template.Spec
	require.Len(t, ps.Containers, 1)
	c := ps.Containers[0]

	// Memory: requested and limited, the limit at least the request, and
	// GOMEMLIMIT below the limit.
	req, lim := bytesOf(t, c.Resources.Requests.Memory), bytesOf(t, c.Resources.Limits.Memory)
	assert.GreaterOrEqual(t, req, int64(450<<20), "one rank peaks at about 430 MB")
	assert.GreaterOrEqual(t, lim, req)
	assert.NotEmpty(t, c.Resources.Requests.CPU)
	assert.NotEmpty(t, c.Resources.Limits.CPU)
	env := map[string]envVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	assert.Less(t, bytesOf(t, strings.TrimSuffix(env["GOMEMLIMIT"].Value, "B")), lim, "GOMEMLIMIT below the limit")

	// The image of deploy/Dockerfile: its binary, its data directory, its
	// user (which the volume is made writable for).
	df, err := os.ReadFile("../Dockerfile")
	require.NoError(t, err)
	assert.Equal(t, "/usr/local/bin/mnist", c.Command[0])
	data := flagValue(c.Command, "-data")
	assert.Equal(t, "/data/mnist", data, "a pod has no module cache: -data names the image's copy")
	assert.Contains(t, string(df), `ENTRYPOINT ["/usr/local/bin/mnist", "-data", "`+data+`"]`)
	sc := ps.SecurityContext
	assert.True(t, sc.RunAsNonRoot)
	assert.Contains(t, string(df), "USER "+strconv.Itoa(sc.RunAsUser)+":"+strconv.Itoa(sc.RunAsGroup)+"\n")
	assert.Equal(t, sc.RunAsGroup, sc.FSGroup, "the volume is writable by the image's group")

	// Checkpoints on a claim every pod mounts read-write at -ckpt-dir.
	ckptDir := flagValue(c.Command, "-ckpt-dir")
	require.NotEmpty(t, ckptDir, "the command saves checkpoints")
	var mounted string
	for _, m := range c.VolumeMounts {
		if m.MountPath == ckptDir {
			mounted = m.Name
		}
	}
	require.NotEmpty(t, mounted, "-ckpt-dir %s is a mounted volume", ckptDir)
	var claim string
	for _, v := range ps.Volumes {
		if v.Name == mounted && v.PersistentVolumeClaim != nil {
			claim = v.PersistentVolumeClaim.ClaimName
		}
	}
	assert.Equal(t, pvc.Metadata.Name, claim, "the checkpoint volume is the manifest's claim")
	assert.Equal(t, []string{"ReadWriteMany"}, pvc.Spec.AccessModes, "every rank reads the checkpoint at a resume")
	assert.Positive(t, bytesOf(t, pvc.Spec.Resources.Requests.Storage))

	// Restarts as gdistrun -max-restarts N: every index may fail N times
	// (each restart of the job fails every rank once), a further failure
	// fails the job, and the total is bounded the same way.
	require.NotNil(t, js.BackoffLimitPerIndex, "backoffLimitPerIndex is -max-restarts")
	n := *js.BackoffLimitPerIndex
	assert.Positive(t, n)
	require.NotNil(t, js.MaxFailedIndexes)
	assert.Equal(t, 0, *js.MaxFailedIndexes, "one rank out of restarts fails the job")
	require.NotNil(t, js.BackoffLimit)
	assert.Equal(t, js.Completions*n, *js.BackoffLimit)
	assert.Equal(t, "Never", ps.RestartPolicy, "required by podFailurePolicy and backoffLimitPerIndex")
	assert.Equal(t, "Failed", js.PodReplacementPolicy)
	require.NotNil(t, js.PodFailurePolicy)
	var failOnUsage, ignoreDisruption bool
	for _, r := range js.PodFailurePolicy.Rules {
		if r.Action == "FailJob" && r.OnExitCodes != nil && r.OnExitCodes.ContainerName == c.Name &&
			r.OnExitCodes.Operator == "In" && slices.Contains(r.OnExitCodes.Values, 2) {
			failOnUsage = true
		}
		if r.Action == "Ignore" && len(r.OnPodConditions) == 1 && r.OnPodConditions[0].Type == "DisruptionTarget" {
			ignoreDisruption = true
		}
	}
	assert.True(t, failOnUsage, "exit status 2 (usage) fails the job without a restart")
	assert.True(t, ignoreDisruption, "preemption and eviction do not count")
	rc := env["GDIST_RESTART_COUNT"]
	require.NotNil(t, rc.ValueFrom, "GDIST_RESTART_COUNT comes from the pod")
	require.NotNil(t, rc.ValueFrom.FieldRef)
	assert.Equal(t, "metadata.annotations['batch.kubernetes.io/job-index-failure-count']", rc.ValueFrom.FieldRef.FieldPath)
}
