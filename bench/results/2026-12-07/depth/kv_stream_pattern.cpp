// The throwaway loop behind "this access pattern" in table.md: 12 layers x (K, V) of 8192 positions x
// 4 KV heads x 128 f16, each group reading its 256-byte head row; one core, best of 3 (g++ -O2 -march=x86-64-v4).
#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <chrono>
#include <time.h>
static double cpu(){ timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t); return t.tv_sec+t.tv_nsec*1e-9; }
// 12 layers x (K,V) of 8192 pos x 4 heads x 128 f16. Read head g's 256B per pos.
int main(int argc,char**argv){
  const int L=12, P=8192, W=512; // f16 elements per pos row
  std::vector<std::vector<uint16_t>> k(L, std::vector<uint16_t>((size_t)P*W, 0x3c00)), v(L, std::vector<uint16_t>((size_t)P*W, 0x3c00));
  for (int mode=0; mode<4; ++mode) {
   double best=1e9;
   for (int rep=0; rep<3; ++rep){
    double t=cpu(); __m512 acc=_mm512_setzero_ps();
    for(int l=0;l<L;++l) for(int g=0; g<4; ++g) {
      const uint16_t* K=k[l].data(); const uint16_t* V=v[l].data();
      for(int p=0;p<P;++p){
        if (mode==1 && p+8<P) { for(int o=0;o<256;o+=64){ _mm_prefetch((const char*)(K+(size_t)(p+8)*W+g*128)+o,_MM_HINT_T0); _mm_prefetch((const char*)(V+(size_t)(p+8)*W+g*128)+o,_MM_HINT_T0);} }
        if (mode==2 && p+32<P) { for(int o=0;o<256;o+=64){ _mm_prefetch((const char*)(K+(size_t)(p+32)*W+g*128)+o,_MM_HINT_T1); _mm_prefetch((const char*)(V+(size_t)(p+32)*W+g*128)+o,_MM_HINT_T1);} }
        const uint16_t* kr; const uint16_t* vr;
        if (mode==3) { kr = K + (size_t)g*P*128 + (size_t)p*128; vr = V + (size_t)g*P*128 + (size_t)p*128; } // head-major
        else { kr = K+(size_t)p*W+g*128; vr = V+(size_t)p*W+g*128; }
        for(int i=0;i<128;i+=16){ acc=_mm512_add_ps(acc,_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(kr+i)))); acc=_mm512_add_ps(acc,_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(vr+i)))); }
      }
    }
    double dt=cpu()-t; if(dt<best) best=dt; if(_mm512_reduce_add_ps(acc)==1.0f) printf("x");
   }
   double bytes=2.0*L*P*W*2; printf("mode %d (%s): %.1f ms, %.2f GB/s\n", mode, mode==0?"strided, no sw prefetch":mode==1?"strided, T0 +8":mode==2?"strided, T1 +32":"head-major contiguous", best*1e3, bytes/best/1e9);
  }
}
