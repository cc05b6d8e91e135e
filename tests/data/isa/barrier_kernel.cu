__global__ void k(float* x){ __shared__ float s[64]; s[threadIdx.x]=x[threadIdx.x]; __syncthreads(); x[threadIdx.x]=s[63-threadIdx.x];}
