/* BLAKE3 against the official test-vector inputs (byte i % 251), digests from the reference
 * `blake3` Python package 1.0.11; one-shot and incremental with awkward split sizes; both the
 * run-time-selected (AVX2) path and the portable one. */
#include <string.h>

#include "blake3.h"
#include "t.h"

static const struct { size_t len; const char *hex; } V[] = {
    {0, "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"},
    {1, "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213"},
    {63, "e9bc37a594daad83be9470df7f7b3798297c3d834ce80ba85d6e207627b7db7b"},
    {64, "4eed7141ea4a5cd4b788606bd23f46e212af9cacebacdc7d1f4c6dc7f2511b98"},
    {65, "de1e5fa0be70df6d2be8fffd0e99ceaa8eb6e8c93a63f2d8d1c30ecb6b263dee"},
    {1023, "10108970eeda3eb932baac1428c7a2163b0e924c9a9e25b35bba72b28f70bd11"},
    {1024, "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7"},
    {1025, "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444"},
    {2048, "e776b6028c7cd22a4d0ba182a8bf62205d2ef576467e838ed6f2529b85fba24a"},
    {2049, "5f4d72f40d7a5f82b15ca2b2e44b1de3c2ef86c426c95c1af0b6879522563030"},
    {3072, "b98cb0ff3623be03326b373de6b9095218513e64f1ee2edd2525c7ad1e5cffd2"},
    {3073, "7124b49501012f81cc7f11ca069ec9226cecb8a2c850cfe644e327d22d3e1cd3"},
    {4096, "015094013f57a5277b59d8475c0501042c0b642e531b0a1c8f58d2163229e969"},
    {4097, "9b4052b38f1c5fc8b1f9ff7ac7b27cd242487b3d890d15c96a1c25b8aa0fb995"},
    {5120, "9cadc15fed8b5d854562b26a9536d9707cadeda9b143978f319ab34230535833"},
    {5121, "628bd2cb2004694adaab7bbd778a25df25c47b9d4155a55f8fbd79f2fe154cff"},
    {6144, "3e2e5b74e048f3add6d21faab3f83aa44d3b2278afb83b80b3c35164ebeca205"},
    {6145, "f1323a8631446cc50536a9f705ee5cb619424d46887f3c376c695b70e0f0507f"},
    {7168, "61da957ec2499a95d6b8023e2b0e604ec7f6b50e80a9678b89d2628e99ada77a"},
    {7169, "a003fc7a51754a9b3c7fae0367ab3d782dccf28855a03d435f8cfe74605e7817"},
    {8192, "aae792484c8efe4f19e2ca7d371d8c467ffb10748d8a5a1ae579948f718a2a63"},
    {8193, "bab6c09cb8ce8cf459261398d2e7aef35700bf488116ceb94a36d0f5f1b7bc3b"},
    {16384, "f875d6646de28985646f34ee13be9a576fd515f76b5b0a26bb324735041ddde4"},
    {31744, "62b6960e1a44bcc1eb1a611a8d6235b6b4b78f32e7abc4fb4c6cdcce94895c47"},
    {102400, "bc3e3d41a1146b069abffad3c0d44860cf664390afce4d9661f7902e7943e085"},
    {1048576, "74cb441fd087764ca9c3694da742ebe30cbeb3060a17009ca81825c7a8d10343"},
};

int main(void) {
    size_t maxn = 1048576;
    unsigned char *buf = malloc(maxn);
    for (size_t i = 0; i < maxn; i++) buf[i] = (unsigned char)(i % 251);
    static const size_t splits[] = {1, 7, 63, 64, 65, 1000, 1024, 4099};
    for (int portable = 0; portable < 2; portable++) {
    mp_blake3_set_portable(portable); /* SIMD path where the CPU has it, then the portable one */
    for (size_t v = 0; v < sizeof V / sizeof V[0]; v++) {
        uint8_t d[32];
        char hx[65];
        mp_blake3_hash(buf, V[v].len, d);
        mp_blake3_hex(d, hx);
        CHECK(strcmp(hx, V[v].hex) == 0, "one-shot len %zu: %s", V[v].len, hx);
        for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++) {
            if (V[v].len > 20000 && splits[s] < 64) continue; /* keep the run short */
            mp_blake3 h;
            mp_blake3_init(&h);
            for (size_t i = 0; i < V[v].len; i += splits[s]) {
                size_t k = V[v].len - i < splits[s] ? V[v].len - i : splits[s];
                mp_blake3_update(&h, buf + i, k);
            }
            mp_blake3_final(&h, d);
            mp_blake3_hex(d, hx);
            CHECK(strcmp(hx, V[v].hex) == 0, "incremental len %zu split %zu: %s", V[v].len, splits[s], hx);
        }
    }
    }
    free(buf);
    T_DONE("test_blake3");
}
