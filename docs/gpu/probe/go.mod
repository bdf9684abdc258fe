module gpuprobe

go 1.26

require github.com/ebitengine/purego v0.9.1
