/*
 * test_chat_json.c - k3run/text/chat_json.c against Python's json module
 * (CHAT-FORMAT.md §7.2-§7.3). Every expected string below was printed by
 * /usr/bin/python3 (3.11.7) while this test was written: repr(float(x)),
 * json.dumps(json.loads(doc), ensure_ascii=False[, separators=(",", ":"),
 * sort_keys=True]) and JSONDecodeError.pos; the generator is in the comments.
 */
#include <stdint.h>

#include "chat_json.h"
#include "k3_test.h"

/* repr(float(x)) by /usr/bin/python3 (3.11.7) */
static const struct { const char *in, *repr; } reprs[] = {
    {"1e16", "1e+16"},
    {"1e-5", "1e-05"},
    {"5e-324", "5e-324"},
    {"1.7976931348623157e308", "1.7976931348623157e+308"},
    {"2.5", "2.5"},
    {"100.0", "100.0"},
    {"1e2", "100.0"},
    {"0.0001", "0.0001"},
    {"1e-4", "0.0001"},
    {"1.5e-05", "1.5e-05"},
    {"123456789012345680000.0", "1.2345678901234568e+20"},
    {"9999999999999998.0", "9999999999999998.0"},
    {"1e15", "1000000000000000.0"},
    {"1e-7", "1e-07"},
    {"-0.0", "-0.0"},
    {"0.1", "0.1"},
    {"0.3", "0.3"},
    {"2.2250738585072014e-308", "2.2250738585072014e-308"},
    {"4.9406564584124654e-324", "5e-324"},
    {"9007199254740993.0", "9007199254740992.0"},
    {"1e22", "1e+22"},
    {"1e23", "1e+23"},
    {"-123.456", "-123.456"},
    {"3.141592653589793", "3.141592653589793"},
    {"1.0000000000000002", "1.0000000000000002"},
    {"0.000123", "0.000123"},
    {"12345.678e10", "123456780000000.0"},
    {"8.98846567431158e307", "8.98846567431158e+307"},
    {"2e-323", "2e-323"},
    {"1e-320", "1e-320"},
};
/* random bit patterns and powers of two: repr by /usr/bin/python3 */
static const struct { uint64_t bits; const char *repr; } repr_bits[] = {
    {0xf2a74de452e6b438ull, "-1.989032661366619e+244"},
    {0x6513270e269e0d37ull, "7.761117632285041e+178"},
    {0x0c5c7fd0a6a3a450ull, "3.980498358697587e-249"},
    {0xd23f0824128b2f33ull, "-1.5432835417340557e+88"},
    {0x1818e811892f902bull, "1.3647584518757569e-192"},
    {0x9531985d5d9dc9f8ull, "-1.3701135617873088e-206"},
    {0xe8e25d940ed90475ull, "-1.7160537630466207e+197"},
    {0x36f675cc81e74ef5ull, "6.294675241195386e-44"},
    {0x1600a35a099950d8ull, "1.0613447212142254e-202"},
    {0x6b0d549b6f03675aull, "4.708325160387546e+207"},
    {0x3d9c172411e20b8full, "6.387016158513563e-12"},
    {0x8d116ece1738f7d9ull, "-9.973130378568733e-246"},
    {0x0f21ddb66cad4a26ull, "8.779753225680271e-236"},
    {0x90c192cfd3ac94afull, "-5.795503248498993e-228"},
    {0xf28c105d1fb17c23ull, "-5.988180159386011e+243"},
    {0xa170b33839263059ull, "-1.306052388527796e-147"},
    {0x953f48f1a09f76b5ull, "-2.436117699484841e-206"},
    {0x0fd630f1f29d0da9ull, "2.233386999150174e-232"},
    {0x95e60af593bd04cfull, "-3.51527970626667e-203"},
    {0x0cb1e29c658cda14ull, "1.5987381841032883e-247"},
    {0x3898d190f9ebdaccull, "4.6678633181812096e-36"},
    {0x8e81973e0becd7b0ull, "-8.441872792105456e-239"},
    {0x2217beaddbc496cbull, "1.9015657400796622e-144"},
    {0x6b4cb2424a23d596ull, "7.370437700706684e+208"},
    {0x8a6a63ec24ede6a4ull, "-1.7163996725272777e-258"},
    {0x922766581e27a1c0ull, "-3.2367190832119987e-221"},
    {0x8f6d05584ef8aa38ull, "-2.2818334634712625e-234"},
    {0xae97ba94d0eda82full, "-3.0536383926309363e-84"},
    {0x1a61dbe22e44158bull, "1.3449551894627777e-181"},
    {0x923a736994e3bf91ull, "-7.317495976062606e-221"},
    {0x301850c5a38fd547ull, "5.249822308814304e-77"},
    {0x18f135d25f557203ull, "1.5450754142984396e-188"},
    {0xb64ce4228c38fb29ull, "-3.953625698224792e-47"},
    {0x907a70c31012f037ull, "-2.72491267476498e-229"},
    {0x9e7769b10f4205b4ull, "-6.505141861548772e-162"},
    {0x7f15052434b9b5dfull, "1.441484839555994e+304"},
    {0x881ed162ae2eb154ull, "-1.4583679262758548e-269"},
    {0xc6f877186d76b07eull, "-7.939416668807721e+33"},
    {0x7731af10506bf2efull, "1.4255183989699612e+266"},
    {0xec66a78795e761d1ull, "-1.525315701232403e+214"},
    {0x5c90a9587403e430ull, "7.750545741548908e+137"},
    {0x3f98e2774cbd87adull, "0.024301399287089676"},
    {0x2e05319acb5c7427ull, "5.326960081783017e-87"},
    {0xc7a2ea20b2f14c94ull, "-1.2570882301712172e+37"},
    {0x14f4733f3e7d1bfbull, "9.952684009002448e-208"},
    {0x4cdd2055930d6eafull, "1.8721667527122837e+62"},
    {0x7ebff20686734721ull, "3.422978398947072e+302"},
    {0x57ee05cde00902c7ull, "3.6967297937384553e+115"},
    {0x72e6cc3ababced20ull, "3.113284956169447e+245"},
    {0x9be4bcfc49b64a08ull, "-2.6202582260546103e-174"},
    {0x12bd4acefaecbd38ull, "2.0745096302730225e-218"},
    {0x830e07bc1e398f10ull, "-5.877500503097409e-294"},
    {0x2a3af4d46b0a18e8ull, "2.938345597354166e-105"},
    {0x5790f82ec1d3fcffull, "6.529598674765832e+113"},
    {0xeeeacbe226e87555ull, "-1.9837344250050814e+226"},
    {0x6bf46c697d2caf82ull, "1.0743030475716402e+212"},
    {0xf646e1f40a097c97ull, "-5.629271400715247e+261"},
    {0x13deef86ab1031d0ull, "5.743310614918485e-213"},
    {0x8ede0d7ac3baea9eull, "-4.61515470702556e-237"},
    {0xca02135e92b1d3f2ull, "-3.302201168194502e+48"},
    {0xd17f9acae01f5057ull, "-3.8373366379117136e+84"},
    {0x571242425051c1ccull, "2.7444240984593666e+111"},
    {0x59a54a7bb1fee08full, "7.037254769664525e+123"},
    {0x7f26144b98289fcdull, "3.0282415270685036e+304"},
    {0xcc011cdd9474031bull, "-1.3427313830183207e+58"},
    {0x119a72d174c9df6aull, "7.145365052251808e-224"},
    {0x17f5e837d70820feull, "3.0010119427191346e-193"},
    {0x451abd81f1d69ed6ull, "8.08174890787967e+24"},
    {0xb2715945795e8229ull, "-1.029599445714058e-65"},
    {0x10a3d6b2aa05e11aull, "1.6356324386913733e-228"},
    {0xbb2d420f0f88080bull, "-1.210084267904234e-23"},
    {0x4f426dcbb394fb36ull, "6.512205859834416e+73"},
    {0x93f448b3a5aa3c81ull, "-1.5063173670565552e-212"},
    {0xae658f33fe3b890bull, "-3.468068334360956e-85"},
    {0x72158370d269a9a5ull, "3.5862982565236525e+241"},
    {0xb774eb5248db40afull, "-1.500880737539812e-41"},
    {0xe315128862c33a4full, "-1.9881605394901064e+169"},
    {0x58d5563dab2cd31eull, "8.608929980762736e+119"},
    {0xf0ce583505c6af07ull, "-2.412056419517317e+235"},
    {0x5affb2297631a992ull, "2.1970596639628e+130"},
    {0x9c6539382b0537e6ull, "-6.864829614150003e-172"},
    {0x7e62aa0a1df9fd78ull, "6.249646571111859e+300"},
    {0x37dc76fb0f17a300ull, "1.3070380624806793e-39"},
    {0x49952399c4aaeac1ull, "3.0170681842882087e+46"},
    {0xbd0561e6211c70cfull, "-9.495701001087435e-15"},
    {0x65dc9f503f63af83ull, "4.750750204750985e+182"},
    {0xeab477d26415479cull, "-1.0267710304426359e+206"},
    {0x7f1b103cdf1582b0ull, "1.8559166032057722e+304"},
    {0x2a96fb1a14a0f9e7ull, "1.6032007377980954e-103"},
    {0x66d2287672fdf202ull, "1.9751801151887592e+187"},
    {0x4720771f8ca81811ull, "4.274642804177215e+34"},
    {0x230d977ee2257159ull, "7.765387138513795e-140"},
    {0x6e36aab0d1bc52d9ull, "8.193439767873551e+222"},
    {0x8cdb305fdd2e1609ull, "-9.721565446084252e-247"},
    {0xb4d66a3a47469a4dull, "-3.6566096214330605e-54"},
    {0xfc891b4a6a50df4dull, "-7.829495745681799e+291"},
    {0xaec6f0245bd86d40ull, "-2.361499160522349e-83"},
    {0x616499c9e25a7605ull, "1.448139668433268e+161"},
    {0x3b1287fff52ddf5dull, "3.8321725482165366e-24"},
    {0x153e7c2a26a2c0bdull, "2.373829056313949e-206"},
    {0x26bb7dbd2d1c9af0ull, "4.1586747791282524e-122"},
    {0xa8948c893b618676ull, "-3.337733639824717e-113"},
    {0x0316909e3bbbe9eaull, "8.832790543982714e-294"},
    {0xd4c28c2e7c26847full, "-2.0284108606212458e+100"},
    {0x2eae05cf96d0cc5full, "7.7271785554382585e-84"},
    {0x482c9cbc43435cc5ull, "4.868121678598285e+39"},
    {0x254b0c4e010c4759ull, "4.877621251706118e-129"},
    {0x88daf4016b4013efull, "-5.224362650831876e-266"},
    {0x9c1caaf75e8766edull, "-2.8977267740353203e-173"},
    {0x519088f590fbbd11ull, "8.030506098092244e+84"},
    {0x20203626f3fe39c0ull, "6.045556425707975e-154"},
    {0xdbf4a8b2b0c4312dull, "-9.38484012349791e+134"},
    {0xf341e07a83f73f16ull, "-1.5624204901097633e+247"},
    {0xa7abe1c29e1a8ef4ull, "-1.3820816268679183e-117"},
    {0xbd628881ad1b72dbull, "-5.267460409693142e-13"},
    {0x74e69a5d0dd27a65ull, "1.3257208647146701e+255"},
    {0xdef88334e647cb8full, "-3.1343387564175544e+149"},
    {0xf3aed0b6c7ac1491ull, "-1.7236642596087033e+249"},
    {0xae3a2b7fdfe01893ull, "-5.26215508230537e-86"},
    {0x8f2c6ec8cc4169a3ull, "-1.3972441246414233e-235"},
    {0x65e7e4236472f1a3ull, "7.930940904982885e+182"},
    {0x64e50cad66237a04ull, "1.0662269838816983e+178"},
    {0x7b45145c1a81682cull, "6.269123622077618e+285"},
    {0x66836886a260cd0bull, "6.597432204635068e+185"},
    {0x30cbc97d0fef7928ull, "1.2286657182299287e-73"},
    {0xfc132d0d113db17dull, "-4.671898820796292e+289"},
    {0x70ccec313571810aull, "2.2990284766219708e+235"},
    {0x1c2442f9298cb3a5ull, "4.0960622500000236e-173"},
    {0x99c94309570dc195ull, "-1.8578815093690756e-184"},
    {0x1a358ca00d75985dull, "2.028598735161868e-182"},
    {0x9118bb16000f49c8ull, "-2.6098858497543247e-226"},
    {0x895fd7b326b94c7full, "-1.5800543282391385e-263"},
    {0xf2ee4e4519f9919cull, "-4.138580468110595e+245"},
    {0x9d1de2a05d158a2full, "-1.979700384530873e-168"},
    {0x1200339d068739faull, "5.602624368784844e-222"},
    {0x353c631cdfd43f37ull, "2.9637577225244357e-52"},
    {0x6050914a9d33a01cull, "8.885378326057658e+155"},
    {0xa268aa872607679dull, "-6.321104805376388e-143"},
    {0xf4998d7c4093f6deull, "-4.683524268002167e+253"},
    {0x9a2ef80f58ee8571ull, "-1.4576712926495294e-182"},
    {0x7961fd925d39d0a8ull, "4.982985442018492e+276"},
    {0x1d87cec31f7296abull, "2.018688023533605e-166"},
    {0x7cf20724d953ee26ull, "7.19616430630608e+293"},
    {0xfa529ba3fe3bfadaull, "-1.6888652122551737e+281"},
    {0x7afb2c68774b15d7ull, "2.5254629938390568e+284"},
    {0x4fd58dbe7bdc968bull, "3.899603970996924e+76"},
    {0x24e4e25a15fc899eull, "5.884498686465263e-131"},
    {0xbfeaa1551a28f7b3ull, "-0.8321939001977995"},
    {0xbd87a86557b6fb7eull, "-2.6895800563014877e-12"},
    {0x7a86f7a243c71b9aull, "1.667616833822443e+282"},
    {0x0000000000000001ull, "5e-324"},
    {0x0000002000000000ull, "6.7903865311e-313"},
    {0x0170000000000000ull, "9.332636185032189e-302"},
    {0x03c0000000000000ull, "1.2826677504057426e-290"},
    {0x0610000000000000ull, "1.7628851326804976e-279"},
    {0x0860000000000000ull, "2.4228908772695546e-268"},
    {0x0ab0000000000000ull, "3.329995865487836e-257"},
    {0x0d00000000000000ull, "4.5767114681873503e-246"},
    {0x0f50000000000000ull, "6.290184345309701e-235"},
    {0x11a0000000000000ull, "8.645163535653227e-224"},
    {0x13f0000000000000ull, "1.188182228934475e-212"},
    {0x1640000000000000ull, "1.6330252207878255e-201"},
    {0x1890000000000000ull, "2.2444127733846047e-190"},
    {0x1ae0000000000000ull, "3.084697427331692e-179"},
    {0x1d30000000000000ull, "4.239575861902385e-168"},
    {0x1f80000000000000ull, "5.826828696250162e-157"},
    {0x21d0000000000000ull, "8.008332380732404e-146"},
    {0x2420000000000000ull, "1.1006568214637918e-134"},
    {0x2670000000000000ull, "1.512731216738015e-123"},
    {0x28c0000000000000ull, "2.07908195312898e-112"},
    {0x2b10000000000000ull, "2.8574684782056875e-101"},
    {0x2d60000000000000ull, "3.9272747722381812e-90"},
    {0x2fb0000000000000ull, "5.397605346934028e-79"},
    {0x3200000000000000ull, "7.418412301374843e-68"},
    {0x3450000000000000ull, "1.0195788231247695e-56"},
    {0x36a0000000000000ull, "1.401298464324817e-45"},
    {0x38f0000000000000ull, "1.925929944387236e-34"},
    {0x3b40000000000000ull, "2.6469779601696886e-23"},
    {0x3d90000000000000ull, "3.637978807091713e-12"},
    {0x3fe0000000000000ull, "0.5"},
    {0x4230000000000000ull, "68719476736.0"},
    {0x4480000000000000ull, "9.44473296573929e+21"},
    {0x46d0000000000000ull, "1.298074214633707e+33"},
    {0x4920000000000000ull, "1.78405961588245e+44"},
    {0x4b70000000000000ull, "2.4519928653854222e+55"},
    {0x4dc0000000000000ull, "3.36999333339383e+66"},
    {0x5010000000000000ull, "4.631683569492648e+77"},
    {0x5260000000000000ull, "6.365737426045269e+88"},
    {0x54b0000000000000ull, "8.749002899132048e+99"},
    {0x5700000000000000ull, "1.2024538023802026e+111"},
    {0x5950000000000000ull, "1.6526399219756215e+122"},
    {0x5ba0000000000000ull, "2.2713710134237715e+133"},
    {0x5df0000000000000ull, "3.1217485503159922e+144"},
    {0x6040000000000000ull, "4.290498537581631e+155"},
    {0x6290000000000000ull, "5.896816288783659e+166"},
    {0x64e0000000000000ull, "8.10452259547069e+177"},
    {0x6730000000000000ull, "1.1138771039116688e+189"},
    {0x6980000000000000ull, "1.5309010345804195e+200"},
    {0x6bd0000000000000ull, "2.1040543606193494e+211"},
    {0x6e20000000000000ull, "2.891790293717215e+222"},
    {0x7070000000000000ull, "3.974446316289815e+233"},
    {0x72c0000000000000ull, "5.462437423415177e+244"},
    {0x7510000000000000ull, "7.5075168288047e+255"},
    {0x7760000000000000ull, "1.0318252561243462e+267"},
    {0x79b0000000000000ull, "1.418129833677085e+278"},
    {0x7c00000000000000ull, "1.94906280228e+289"},
    {0x7e50000000000000ull, "2.6787715179656683e+300"},
};
/* 0.1 + 0.2 */ static const char repr_sum[] = "0.30000000000000004";
/* json.dumps(json.loads(doc), ensure_ascii=False, separators=(',', ':'), sort_keys=True) and json.dumps(json.loads(doc), ensure_ascii=False) */
static const struct { const char *doc, *compact, *py; } dumps[] = {
    {"{\"b\": [1, 2.50, -0, 1e2, 12345678901234567890123], \"a\": {\"z\": null, \"y\": true}, \"\\u00e9\": \"x\", \"\\u20ac\": 1, \"\\ud83d\\ude00\": 2, \"Z\": false, \"a\": {\"k\": \"last\"}}",
     "{\"Z\":false,\"a\":{\"k\":\"last\"},\"b\":[1,2.5,0,100.0,12345678901234567890123],\"\xc3""\xa9""\":\"x\",\"\xe2""\x82""\xac""\":1,\"\xf0""\x9f""\x98""\x80""\":2}",
     "{\"b\": [1, 2.5, 0, 100.0, 12345678901234567890123], \"a\": {\"k\": \"last\"}, \"\xc3""\xa9""\": \"x\", \"\xe2""\x82""\xac""\": 1, \"\xf0""\x9f""\x98""\x80""\": 2, \"Z\": false}"},
    {"{\"s\": \"tab\\there\\nnew \\\"q\\\" \\\\ \\u0001 \\u001f / \\u007f \\u2028 \\u00e9 \\ud83d\\ude00\", \"n\": [1e400, -1e400, 0.5e-4, 1E+2]}",
     "{\"n\":[Infinity,-Infinity,5e-05,100.0],\"s\":\"tab\\there\\nnew \\\"q\\\" \\\\ \\u0001 \\u001f / \x7f"" \xe2""\x80""\xa8"" \xc3""\xa9"" \xf0""\x9f""\x98""\x80""\"}",
     "{\"s\": \"tab\\there\\nnew \\\"q\\\" \\\\ \\u0001 \\u001f / \x7f"" \xe2""\x80""\xa8"" \xc3""\xa9"" \xf0""\x9f""\x98""\x80""\", \"n\": [Infinity, -Infinity, 5e-05, 100.0]}"},
    {"[{}, [], {\"x\": {\"b\": 1, \"a\": 2, \"b\": 3}}, \"\", 0, -0.0]",
     "[{},[],{\"x\":{\"a\":2,\"b\":3}},\"\",0,-0.0]",
     "[{}, [], {\"x\": {\"b\": 3, \"a\": 2}}, \"\", 0, -0.0]"},
};

/* parse a document (strict), dump value 0 in both styles */
static void check_dumps(void)
{
    for (size_t i = 0; i < sizeof dumps / sizeof dumps[0]; i++) {
        k3cj_doc doc;
        k3cj_error je;
        int r = k3cj_parse(dumps[i].doc, strlen(dumps[i].doc), K3CJ_STRICT, &doc, &je);
        CHECK_MSG(r == 0, "doc %zu: %s at %zu", i, je.text, je.off);
        if (r) continue;
        for (int style = 0; style < 2; style++) {
            k3cj_buf b = {0};
            k3_diag d;
            CHECK(k3cj_dump(&doc, 0, style, &b, &d) == K3_OK);
            k3cj_buf_put(&b, "", 1);
            CHECK_STR(b.p, style == K3CJ_COMPACT_SORTED ? dumps[i].compact : dumps[i].py);
            free(b.p);
        }
        k3cj_free(&doc);
    }
}

static void check_repr(void)
{
    char b[32];
    for (size_t i = 0; i < sizeof reprs / sizeof reprs[0]; i++) {
        k3cj_repr_double(strtod(reprs[i].in, NULL), b);
        CHECK_MSG(!strcmp(b, reprs[i].repr), "%s: got %s, python %s", reprs[i].in, b, reprs[i].repr);
    }
    for (size_t i = 0; i < sizeof repr_bits / sizeof repr_bits[0]; i++) {
        double x;
        memcpy(&x, &repr_bits[i].bits, 8);
        k3cj_repr_double(x, b);
        CHECK_MSG(!strcmp(b, repr_bits[i].repr), "%016llx: got %s, python %s", (unsigned long long)repr_bits[i].bits,
                  b, repr_bits[i].repr);
    }
    volatile double a = 0.1, c = 0.2;
    k3cj_repr_double(a + c, b);
    CHECK_STR(b, repr_sum);
    k3cj_repr_double(INFINITY, b);
    CHECK_STR(b, "inf");
    k3cj_repr_double(-NAN, b);
    CHECK_STR(b, "nan");
}

/* python3 -c 'import json; json.loads(doc)' -> JSONDecodeError.pos */
static void check_errors(void)
{
    static const struct { const char *doc; size_t off; int lax_ok; } bad[] = {
        {"{\"a\": 1,}", 8, 0},      /* Expecting property name enclosed in double quotes */
        {"[1, 2", 5, 0},            /* Expecting ',' delimiter */
        {"{\"a\" 1}", 5, 0},        /* Expecting ':' delimiter */
        {"\"abc", 0, 0},            /* Unterminated string starting at */
        {"\"a\x01" "b\"", 2, 1},    /* Invalid control character at (strict only) */
        {"[1] x", 4, 0},            /* Extra data */
        {"[\"\\u12\"]", 3, 0},      /* Invalid \uXXXX escape */
        {"[\"\\x\"]", 2, 0},        /* Invalid \escape */
        {"[01]", 2, 0},             /* Expecting ',' delimiter */
        {"[1e]", 2, 0},             /* Expecting ',' delimiter */
        {"[1,,2]", 3, 0},           /* Expecting value */
        {"[\"\\ud83d\\uZZZZ\"]", 9, 0},
        {"{\"a\":1", 6, 0},
        {"[tru]", 1, 0},
        {"\xEF\xBB\xBF[1]", 0, 1},  /* Unexpected UTF-8 BOM */
        {"[\"\xC3\"]", 2, 1},       /* invalid UTF-8 (Python cannot decode the file) */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        k3cj_doc doc;
        k3cj_error je;
        int r = k3cj_parse(bad[i].doc, strlen(bad[i].doc), K3CJ_STRICT, &doc, &je);
        CHECK_MSG(r != 0 && je.off == bad[i].off, "bad %zu: r %d off %zu (%s), python %zu", i, r, je.off, je.text,
                  bad[i].off);
        if (!r) k3cj_free(&doc);
        r = k3cj_parse(bad[i].doc, strlen(bad[i].doc), K3CJ_LAX, &doc, &je);
        if (i < 14) CHECK_MSG((r == 0) == bad[i].lax_ok, "bad %zu in lax mode: %d", i, r);
        if (!r) k3cj_free(&doc);
    }
}

static void check_values(void)
{
    k3cj_doc doc;
    k3cj_error je;
    k3_diag d;
    /* duplicates: lookup gives the last; the dict keeps the first position */
    const char *s = "{\"a\": 1, \"b\": [true, false, null], \"a\": \"two\", \"c\": 12345678901234567890123, \"z\": -0}";
    REQUIRE(k3cj_parse(s, strlen(s), K3CJ_STRICT, &doc, &je) == 0);
    uint32_t a = k3cj_get(&doc, 0, "a");
    CHECK(a && doc.v[a].type == K3CJ_STR && k3cj_streq(&doc, a, "two"));
    CHECK(k3cj_get(&doc, 0, "nope") == 0);
    CHECK_EQ_U64(doc.v[0].n, 5);
    uint32_t *pairs;
    size_t n;
    REQUIRE(k3cj_dict(&doc, 0, 0, &pairs, &n, &d) == K3_OK);
    CHECK_EQ_U64(n, 4);
    CHECK(k3cj_streq(&doc, pairs[0], "a") && pairs[1] == a && k3cj_streq(&doc, pairs[2], "b"));
    free(pairs);
    uint32_t b = k3cj_get(&doc, 0, "b"), c = k3cj_get(&doc, 0, "c"), z = k3cj_get(&doc, 0, "z");
    CHECK(doc.v[b].off == 14 && doc.v[b].len == 19);           /* the exact slice "[true, false, null]" */
    const char *t;
    size_t tn;
    k3cj_int_text(&doc, c, &t, &tn);
    CHECK(tn == 23 && !memcmp(t, "12345678901234567890123", 23));
    k3cj_int_text(&doc, z, &t, &tn);
    CHECK(tn == 1 && t[0] == '0');
    CHECK(!k3cj_truthy(&doc, z) && k3cj_truthy(&doc, c) && k3cj_truthy(&doc, b));
    k3cj_free(&doc);

    /* Python truthiness */
    s = "[0, 0.0, -0.0, \"\", [], {}, null, false, NaN, 1e-300, \" \", [0], {\"\": 0}, true]";
    REQUIRE(k3cj_parse(s, strlen(s), K3CJ_STRICT, &doc, &je) == 0);
    int k = 0;
    for (uint32_t m = k3cj_first(&doc, 0); m; m = k3cj_next(&doc, 0, m), k++)
        CHECK_MSG(k3cj_truthy(&doc, m) == (k >= 8), "element %d", k);
    k3cj_free(&doc);

    /* NaN and the infinities: accepted in both modes (as json.loads does), dumped as Python does */
    s = "[NaN, Infinity, -Infinity, 1e400, -1e400]";
    for (int lax = 0; lax < 2; lax++) {
        REQUIRE(k3cj_parse(s, strlen(s), lax, &doc, &je) == 0);
        k3cj_buf o = {0};
        CHECK(k3cj_dump(&doc, 0, K3CJ_COMPACT_SORTED, &o, &d) == K3_OK);
        k3cj_buf_put(&o, "", 1);
        CHECK_STR(o.p, "[NaN,Infinity,-Infinity,Infinity,-Infinity]");
        free(o.p);
        k3cj_free(&doc);
    }

    /* integers: 4300 digits are fine, 4301 are refused (sys.get_int_max_str_digits) */
    char *big = malloc(4303);
    REQUIRE(big);
    big[0] = '-';
    memset(big + 1, '7', 4301);
    CHECK(k3cj_parse(big, 4301, K3CJ_STRICT, &doc, &je) == 0);
    k3cj_free(&doc);
    CHECK(k3cj_parse(big, 4302, K3CJ_STRICT, &doc, &je) != 0 && je.kind == K3CJ_E_RANGE);
    free(big);

    /* raw control characters: refused strictly, kept in lax mode (JSONDecoder(strict=False)) */
    s = "\"a\nb\tc\x01\"";
    CHECK(k3cj_parse(s, strlen(s), K3CJ_STRICT, &doc, &je) != 0 && je.off == 2);
    REQUIRE(k3cj_parse(s, strlen(s), K3CJ_LAX, &doc, &je) == 0);
    CHECK(doc.v[0].n == 6 && !memcmp(k3cj_str(&doc, 0), "a\nb\tc\x01", 6));
    k3cj_free(&doc);

    /* \u0000 is a character */
    s = "\"x\\u0000y\"";
    REQUIRE(k3cj_parse(s, strlen(s), K3CJ_STRICT, &doc, &je) == 0);
    CHECK(doc.v[0].n == 3 && !memcmp(k3cj_str(&doc, 0), "x\0y", 3));
    k3cj_free(&doc);
}

/* json.loads('"\\ud800\\udc00x\\ud83d"') is [0x10000, 'x', 0xd83d] (python3); tiktoken's
   utf-16 surrogatepass round trip joins a high and a low surrogate that meet, else U+FFFD */
static void check_surrogates(void)
{
    k3cj_doc doc;
    k3cj_error je;
    const char *s = "[\"\\ud800\\udc00x\\ud83d\", \"\\ude00\", \"\\ud83d\\u0041\", \"\\udc00\\ud800\"]";
    REQUIRE(k3cj_parse(s, strlen(s), K3CJ_STRICT, &doc, &je) == 0);
    uint32_t e0 = 1, e1 = doc.v[e0].next, e2 = doc.v[e1].next, e3 = doc.v[e2].next;
    CHECK(doc.v[e0].n == 8 && !memcmp(k3cj_str(&doc, e0), "\xF0\x90\x80\x80x\xED\xA0\xBD", 8));
    CHECK(doc.v[e1].n == 3 && !memcmp(k3cj_str(&doc, e1), "\xED\xB8\x80", 3));
    CHECK(doc.v[e2].n == 4 && !memcmp(k3cj_str(&doc, e2), "\xED\xA0\xBD" "A", 4));
    k3cj_buf b = {0};
    k3cj_wtf8_fix(&b, k3cj_str(&doc, e0), doc.v[e0].n);            /* a lone high at the end */
    CHECK(b.n == 8 && !memcmp(b.p, "\xF0\x90\x80\x80x\xEF\xBF\xBD", 8));
    b.n = 0;
    k3cj_buf cat = {0};                                             /* "\ud83d" + "\ude00" joined: U+1F600 */
    k3cj_buf_put(&cat, "\xED\xA0\xBD", 3);
    k3cj_buf_put(&cat, k3cj_str(&doc, e1), doc.v[e1].n);
    k3cj_wtf8_fix(&b, cat.p, cat.n);
    CHECK(b.n == 4 && !memcmp(b.p, "\xF0\x9F\x98\x80", 4));
    b.n = 0;
    k3cj_wtf8_fix(&b, k3cj_str(&doc, e3), doc.v[e3].n);            /* low then high: two U+FFFD */
    CHECK(b.n == 6 && !memcmp(b.p, "\xEF\xBF\xBD\xEF\xBF\xBD", 6));
    free(b.p);
    free(cat.p);
    k3cj_free(&doc);

    /* keys sort by code point, lone surrogates between U+D7FF and U+E000 (sorted() in python3) */
    s = "{\"\\ue000\": 1, \"\\ud800\": 2, \"\\uffff\": 3, \"\\ud83d\\ude00\": 4, \"\\ud7ff\": 5, \"\\ud801\": 6, \"\\ud800\": 7}";
    REQUIRE(k3cj_parse(s, strlen(s), K3CJ_STRICT, &doc, &je) == 0);
    uint32_t *pairs;
    size_t n;
    k3_diag d;
    REQUIRE(k3cj_dict(&doc, 0, 1, &pairs, &n, &d) == K3_OK);
    static const char *const want[] = {"5", "7", "6", "1", "3", "4"};      /* d7ff d800 d801 e000 ffff 1f600 */
    CHECK_EQ_U64(n, 6);
    for (size_t i = 0; i < n && i < 6; i++) {
        const k3cj_val *v = &doc.v[pairs[2 * i + 1]];
        CHECK_MSG(v->len == 1 && doc.src[v->off] == want[i][0], "key %zu", i);
    }
    free(pairs);
    k3cj_free(&doc);
}

/* JSONDecoder(strict=False).raw_decode(s, idx): one value at idx, the rest unread */
static void check_prefix(void)
{
    k3cj_doc doc = {0};
    k3cj_error je;
    size_t end;
    const char *s = "{\"k\": {\"b\": 2,\n \"a\": 1} trailing, \"x\": 1e2]";
    REQUIRE(k3cj_parse_prefix(s, strlen(s), 6, K3CJ_LAX, &doc, &end, &je) == 0);
    CHECK(doc.v[0].type == K3CJ_OBJ && end == 23 && doc.v[0].len == 17);
    REQUIRE(k3cj_parse_prefix(s, strlen(s), 39, K3CJ_LAX, &doc, &end, &je) == 0);   /* buffers reused */
    CHECK(doc.v[0].type == K3CJ_REAL && doc.v[0].d == 100.0 && end == 42);
    CHECK(k3cj_parse_prefix(s, strlen(s), 5, K3CJ_LAX, &doc, &end, &je) != 0);      /* a space: no value */
    CHECK(k3cj_parse_prefix("nullx", 5, 0, K3CJ_LAX, &doc, &end, &je) == 0 && end == 4);
    CHECK(k3cj_parse_prefix("-Infinity", 9, 0, K3CJ_LAX, &doc, &end, &je) == 0 && isinf(doc.v[0].d) &&
          doc.v[0].d < 0);
    CHECK(k3cj_parse_prefix("1.", 2, 0, K3CJ_LAX, &doc, &end, &je) == 0 && end == 1 &&
          doc.v[0].type == K3CJ_INT);
    CHECK(k3cj_parse_prefix("1e+", 3, 0, K3CJ_LAX, &doc, &end, &je) == 0 && end == 1);
    k3cj_free(&doc);
    /* depth */
    char deep[1100];
    memset(deep, '[', sizeof deep);
    CHECK(k3cj_parse_prefix(deep, sizeof deep, 0, K3CJ_LAX, &doc, &end, &je) != 0 && je.kind == K3CJ_E_DEPTH);
    k3cj_free(&doc);
}

static void check_strings_out(void)
{
    /* json.dumps("\x00\x08\x0c\x1b\x7f/\u2028", ensure_ascii=False) == '"\\u0000\\b\\f\\u001b\x7f/\u2028"' */
    k3cj_buf b = {0};
    k3cj_dump_str(&b, "\0\b\f\x1b\x7f/\xE2\x80\xA8", 9);
    k3cj_buf_put(&b, "", 1);
    CHECK_STR(b.p, "\"\\u0000\\b\\f\\u001b\x7f/\xE2\x80\xA8\"");
    free(b.p);
    static const uint32_t sp[] = {9, 10, 11, 12, 13, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680, 0x2000,
                                  0x2005, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) CHECK(k3cj_py_isspace(sp[i]));
    static const uint32_t no[] = {0, 8, 0x0e, 0x1b, 0x21, 0x84, 0x180e, 0x200b, 0x2060, 0xfeff, 0xd800};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) CHECK(!k3cj_py_isspace(no[i]));
}

int main(void)
{
    check_repr();
    check_dumps();
    check_errors();
    check_values();
    check_surrogates();
    check_prefix();
    check_strings_out();
    return k3_test_done();
}
