import random, sys
def run(policy, p, k, steps=95, seed=1):
    rng = random.Random(seed)
    length=1; acc=0.5; pause=0; nextp=32; tried=0
    paused=0; tokens=0; passes=0; pos=0
    s=0
    while pos < steps:
        L = 0 if pause>0 else length
        if L==0:
            paused+=1; pause-=1; pos+=1; continue
        a=0
        while a<L and rng.random()<p: a+=1
        pos += a+1; passes+=1
        if policy=='old':
            rate=a/L; acc=0.7*acc+0.3*rate
        else:
            t = a+1 if a<L else a
            for i in range(t):
                w = 0.3 if tried<4 else 0.1
                acc=(1-w)*acc+w*(1.0 if i<a else 0.0); tried+=1
        length = min(k,length+1) if a==L else max(1,a+1)
        if a>0: nextp=32
        if acc<0.25:
            pause=nextp; nextp=min(512,2*nextp); acc=0.3; length=1; tried=0
    return paused, passes
for p in (0,0.5,0.7,0.9):
  for k in (1,2,3):
    res=[]
    for pol in ('old','new'):
        ps=[run(pol,p,k,95,seed) for seed in range(200)]
        res.append(sum(x[0] for x in ps)/len(ps))
    print(f"p={p} k={k}: mean paused steps of 95: old {res[0]:.1f} new {res[1]:.1f}")
