package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/gtrain/gtrain/internal/jobfile"
)

// k8sObject is what the test reads of a Kubernetes object.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"` // a ConfigMap's
	Spec struct {
		AccessModes    []string `yaml:"accessModes"` // a PersistentVolumeClaim's
		Parallelism    int      `yaml:"parallelism"`
		CompletionMode string   `yaml:"completionMode"`
		Template       struct {
			Spec struct {
				Subdomain  string `yaml:"subdomain"`
				Containers []struct {
					Command      []string `yaml:"command"`
					Args         []string `yaml:"args"`
					VolumeMounts []struct {
						Name      string `yaml:"name"`
						MountPath string `yaml:"mountPath"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
				Volumes []k8sVolume `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// k8sVolume is a pod's volume: one of its sources is set.
type k8sVolume struct {
	Name   string `yaml:"name"`
	Secret *struct {
		SecretName string `yaml:"secretName"`
	} `yaml:"secret"`
	ConfigMap *struct {
		Name string `yaml:"name"`
	} `yaml:"configMap"`
	PersistentVolumeClaim *struct {
		ClaimName string `yaml:"claimName"`
	} `yaml:"persistentVolumeClaim"`
}

// TestKubernetesExample: each manifest of examples/kubernetes is YAML
// whose Indexed Job runs a gtrain run command line that gtrain accepts, in
// per-node mode, with --nnodes its parallelism, the endpoint pod 0 of its
// headless Service, and the secret file in a mounted Secret. train.yaml
// runs a command; engine.yaml runs the built-in engine on the job of its
// ConfigMap (which gtrain loads), in a working directory on its
// ReadWriteMany PersistentVolumeClaim, which every pod mounts.
func TestKubernetesExample(t *testing.T) {
	for _, tc := range []struct {
		file   string
		engine bool
	}{{"train.yaml", false}, {"engine.yaml", true}} {
		t.Run(tc.file, func(t *testing.T) {
			objs := readManifest(t, tc.file)
			o, pod := checkPerNodeJob(t, objs)
			if tc.engine {
				checkEngineJob(t, objs, o, pod)
			} else if len(o.Command) == 0 {
				t.Errorf("the pods run the built-in engine, want a command")
			}
		})
	}
}

// readManifest reads the objects of examples/kubernetes/file by kind.
func readManifest(t *testing.T, file string) map[string]k8sObject {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "kubernetes", file))
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]k8sObject{}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	for {
		var o k8sObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if _, dup := objs[o.Kind]; dup {
			t.Fatalf("%s: two objects of kind %s", file, o.Kind)
		}
		objs[o.Kind] = o
	}
	return objs
}

// checkPerNodeJob checks the Indexed Job and Service of objs and returns
// the options of the Job's gtrain run, as pod 1 parses them, and a
// function naming the volume a path of the pod is in.
func checkPerNodeJob(t *testing.T, objs map[string]k8sObject) (*RunOptions, func(string) *k8sVolume) {
	t.Helper()
	job, svc := objs["Job"], objs["Service"]
	if job.Spec.CompletionMode != "Indexed" || len(job.Spec.Template.Spec.Containers) != 1 || svc.Metadata.Name == "" {
		t.Fatalf("want a Service and an Indexed Job of one container, got %+v", objs)
	}
	c := job.Spec.Template.Spec.Containers[0]
	argv := append(append([]string(nil), c.Command...), c.Args...)
	if len(argv) < 2 || argv[0] != "gtrain" || argv[1] != "run" {
		t.Fatalf("the container runs %q, want gtrain run", argv)
	}
	// Kubernetes expands $(VAR) from the container's environment.
	r := strings.NewReplacer("$(JOB_COMPLETION_INDEX)", "1", "$(RDZV_ID)", "0b7a3f1e-uid")
	for i := range argv {
		argv[i] = r.Replace(argv[i])
	}
	o := parseRun(t, new(bytes.Buffer), argv[2:]...)
	if !o.PerNode() {
		t.Errorf("gtrain %q is not per-node mode", argv[1:])
	}
	if o.NNodes == "" || o.NNodes != strconv.Itoa(job.Spec.Parallelism) {
		t.Errorf("--nnodes %q, parallelism %d: want them equal", o.NNodes, job.Spec.Parallelism)
	}
	wantEndpoint := job.Metadata.Name + "-0." + job.Spec.Template.Spec.Subdomain + ":29400"
	if o.RendezvousEndpoint != wantEndpoint || job.Spec.Template.Spec.Subdomain != svc.Metadata.Name {
		t.Errorf("--rdzv-endpoint %q, subdomain %q, service %q: want pod 0 of the service, %s",
			o.RendezvousEndpoint, job.Spec.Template.Spec.Subdomain, svc.Metadata.Name, wantEndpoint)
	}
	pod := func(path string) *k8sVolume {
		for _, m := range c.VolumeMounts {
			if path != m.MountPath && !strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
				continue
			}
			for i, v := range job.Spec.Template.Spec.Volumes {
				if v.Name == m.Name {
					return &job.Spec.Template.Spec.Volumes[i]
				}
			}
		}
		return nil
	}
	if v := pod(o.SecretFile); o.SecretFile == "" || v == nil || v.Secret == nil {
		t.Errorf("--rdzv-secret-file %q is not in a mounted Secret", o.SecretFile)
	}
	if o.NodeRank != "1" || o.RunID != "0b7a3f1e-uid" {
		t.Errorf("--node-rank %q, --rdzv-id %q: want 1 and the uid", o.NodeRank, o.RunID)
	}
	if _, _, _, err := o.CheckPerNode(); err != nil {
		t.Errorf("gtrain refuses the example's flags: %v", err)
	}
	return o, pod
}

// checkEngineJob checks that o runs the built-in engine on the job of
// the manifest's ConfigMap, in a directory on its ReadWriteMany claim.
func checkEngineJob(t *testing.T, objs map[string]k8sObject, o *RunOptions, pod func(string) *k8sVolume) {
	t.Helper()
	if len(o.Command) != 0 {
		t.Fatalf("the pods run %q, want the built-in engine (no command)", o.Command)
	}
	cm, pvc := objs["ConfigMap"], objs["PersistentVolumeClaim"]
	v := pod(o.Job)
	if v == nil || v.ConfigMap == nil || v.ConfigMap.Name != cm.Metadata.Name || cm.Data[filepath.Base(o.Job)] == "" {
		t.Fatalf("--job %q is not a key of the mounted ConfigMap %s", o.Job, cm.Metadata.Name)
	}
	job := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(job, []byte(cm.Data[filepath.Base(o.Job)]), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := jobfile.Load(t.Context(), job, o.Sets)
	if err != nil {
		t.Fatalf("gtrain refuses the ConfigMap's job: %v", err)
	}
	if spec.Checkpoint.Dir != "" {
		t.Errorf("the job sets checkpoint.dir %q: want runs/<rdzv-id> in --chdir", spec.Checkpoint.Dir)
	}
	v = pod(o.Chdir)
	if o.Chdir == "" || v == nil || v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != pvc.Metadata.Name {
		t.Errorf("--chdir %q, where runs/<rdzv-id> goes, is not on the mounted claim %s", o.Chdir, pvc.Metadata.Name)
	}
	if len(pvc.Spec.AccessModes) != 1 || pvc.Spec.AccessModes[0] != "ReadWriteMany" {
		t.Errorf("claim %s has access modes %q: want ReadWriteMany, which pods on several nodes can mount", pvc.Metadata.Name, pvc.Spec.AccessModes)
	}
}
